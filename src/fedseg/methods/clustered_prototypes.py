"""Shared pieces of the FedBCS comparison's prototype baselines (FedContrast, FedPLVM; MOON,
FedProto, FPL and FedUV use them too): a multi-positive prototype InfoNCE (with FedPLVM's
optional alpha power, class-balanced by :mod:`fedseg.methods.balanced`), seeded k-means,
aggregation weights, a ``(logits, features)`` view of a network and an ordered feature pass.

A pixel of the chosen feature map (default ``dec1``, the UNet's full-resolution penultimate
decoder map, the segmentation analogue of the classifiers' penultimate features) is a sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.methods.aggregate import sample_weights
from fedseg.methods.balanced import Balance, balanced_mean
from fedseg.methods.base import ClientContext, Payload
from fedseg.models.features import named_features

__all__ = [
    "FeatureView",
    "Weighting",
    "aggregation_weights",
    "feature_pass",
    "infonce_rows",
    "kmeans",
    "prototype_infonce",
]

Weighting = Literal["samples", "uniform"]


def aggregation_weights(uploads: Mapping[str, Payload], weighting: Weighting) -> dict[str, float]:
    """Model-averaging weights: by sample count (FedBCS's protocol for every method) or
    uniform (HarmoFL's and FedPLVM's own code)."""
    if weighting == "samples":
        return sample_weights(uploads)
    return {s: 1.0 / len(uploads) for s in uploads}


def infonce_rows(
    features: torch.Tensor,
    classes: torch.Tensor,
    prototypes: torch.Tensor,
    proto_classes: torch.Tensor,
    tau: float,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pixel ``-log(sum_pos exp(s/tau) / sum_all exp(s/tau))`` with ``s = cos(f, p)``
    (``alpha == 1``) or FedPLVM's ``s = max(cos, eps)^alpha``, by log-sum-exp: ``(values [N],
    has [N])``. Positives are the prototypes of the pixel's class, negatives every other
    prototype; a pixel whose class has no prototype (``has`` false) has the value 0."""
    if len(prototypes) == 0 or len(features) == 0:
        none = torch.zeros(len(features), dtype=torch.bool, device=features.device)
        return features.sum(1) * 0.0, none
    sim = F.normalize(features, dim=1) @ F.normalize(prototypes.to(features), dim=1).T
    if alpha != 1.0:
        # cos^alpha is undefined below 0 and has an infinite slope at 0: clamp (no gradient
        # below eps), as FedPLVM needs non-negative (post-ReLU) features anyway
        sim = sim.clamp(min=1e-4).pow(alpha)
    logits = sim / tau
    pos = classes[:, None] == proto_classes.to(classes.device)[None, :]
    has = pos.any(1)
    pos = pos | ~has[:, None]  # a row without positives: numerator = denominator, value 0
    num = torch.logsumexp(logits.masked_fill(~pos, float("-inf")), dim=1)
    return torch.logsumexp(logits, dim=1) - num, has


def prototype_infonce(
    features: torch.Tensor,
    classes: torch.Tensor,
    prototypes: torch.Tensor,
    proto_classes: torch.Tensor,
    tau: float,
    alpha: float = 1.0,
    balance: Balance = "classes",
) -> torch.Tensor:
    """:func:`infonce_rows` averaged over the pixels whose class has a prototype, each class
    weighing the same (``balance: classes``) or each pixel (``pixels``); 0, still connected
    to the graph, when no pixel has one."""
    values, has = infonce_rows(features, classes, prototypes, proto_classes, tau, alpha)
    if not has.any():
        return features.sum() * 0.0
    return balanced_mean(values[has], classes[has], balance)


def kmeans(
    points: torch.Tensor, k: int, generator: torch.Generator, iters: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(centroids [min(k, N), D], member counts)`` of Lloyd's k-means on ``points`` ``[N, D]``
    (float64 on the CPU) with k-means++ seeding drawn from ``generator``; a cluster that
    empties keeps its previous centroid and a count of 0."""
    x = points.detach().double().cpu()
    k = min(k, len(x))
    if k == 0:
        return x[:0].float(), torch.zeros(0, dtype=torch.long)
    first = int(torch.randint(len(x), (1,), generator=generator))
    centroids = x[first : first + 1]
    for _ in range(1, k):
        d2 = torch.cdist(x, centroids).pow(2).min(1).values
        if float(d2.sum()) == 0.0:  # fewer distinct points than k: duplicate a centroid
            centroids = torch.cat([centroids, centroids[-1:]])
            continue
        pick = int(torch.multinomial(d2 / d2.sum(), 1, generator=generator))
        centroids = torch.cat([centroids, x[pick : pick + 1]])
    assign = torch.cdist(x, centroids).argmin(1)
    for _ in range(iters):
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        seen = counts > 0
        centroids = centroids.clone()
        centroids[seen] = sums[seen] / counts[seen, None]
        new = torch.cdist(x, centroids).argmin(1)
        if torch.equal(new, assign):
            break
        assign = new
    members = torch.cdist(x, centroids).argmin(1)  # membership under the returned centroids
    return centroids.float(), torch.bincount(members, minlength=k)


class FeatureView(nn.Module):
    """A view of a network whose ``forward`` returns ``(logits, feature map at level)``; it
    owns no parameters (``.net`` is the network, as the optimiser-state helpers expect)."""

    def __init__(self, net: nn.Module, level: str) -> None:
        super().__init__()
        self.net, self.level = net, level

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, feats = named_features(self.net, x, [self.level])
        return logits, feats[self.level]


def feature_pass(
    model: nn.Module, ctx: ClientContext, level: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(features [B, D, *S] at level, labels)`` of one ordered, un-augmented pass over the
    site's training data, in eval mode and without gradients (FedPLVM's extra pass after
    local training); the model is back in training mode afterwards."""
    model.eval()
    with torch.no_grad():
        for images, labels in ctx.ordered_batches():
            _, feats = named_features(model, images, [level])
            yield feats[level].detach(), labels
    model.train()
