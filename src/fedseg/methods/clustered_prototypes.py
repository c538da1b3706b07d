"""Shared pieces of the FedBCS comparison's clustered-prototype baselines (FedContrast,
FedPLVM): class-balanced pixel sampling, a multi-positive prototype InfoNCE (with FedPLVM's
optional alpha power), seeded k-means, aggregation weights, and a base method that trains on a
feature level with a prototype loss and collects features in an ordered pass afterwards.

A pixel of the chosen feature map (default ``dec1``, the UNet's full-resolution penultimate
decoder map, the segmentation analogue of the classifiers' penultimate features) is a sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import sample_weights, weighted_average
from fedseg.methods.base import (
    ClientContext,
    Method,
    MethodConfig,
    Payload,
)
from fedseg.methods.prototypes import resize_labels
from fedseg.methods.training import segmentation_loss, train_steps
from fedseg.models.features import named_features

__all__ = [
    "ClusteredPrototypeConfig",
    "ClusteredPrototypeMethod",
    "FeatureView",
    "Weighting",
    "aggregation_weights",
    "kmeans",
    "prototype_infonce",
    "sample_pixels",
]

Weighting = Literal["samples", "uniform"]


def aggregation_weights(uploads: Mapping[str, Payload], weighting: Weighting) -> dict[str, float]:
    """Model-averaging weights: by sample count (FedBCS's protocol for every method) or
    uniform (HarmoFL's and FedPLVM's own code)."""
    if weighting == "samples":
        return sample_weights(uploads)
    return {s: 1.0 / len(uploads) for s in uploads}


def sample_pixels(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    cap: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features [P, D], classes [P])`` of the labelled pixels of ``features`` ``[B, D, *S]``
    (labels resized to ``S`` with legacy nearest; ignored pixels match no class), at most
    ``cap`` per class, drawn without replacement with ``generator`` when a class has more."""
    y = resize_labels(labels, tuple(features.shape[2:])).flatten().cpu()
    f = features.flatten(2).transpose(1, 2).reshape(-1, features.shape[1])
    picks = []
    for c in range(num_classes):
        idx = torch.nonzero(y == c).flatten()
        if len(idx) > cap:
            idx = idx[torch.randperm(len(idx), generator=generator)[:cap]]
        picks.append(idx)
    chosen = torch.cat(picks)
    return f[chosen.to(f.device)], y[chosen].to(f.device)


def prototype_infonce(
    features: torch.Tensor,
    classes: torch.Tensor,
    prototypes: torch.Tensor,
    proto_classes: torch.Tensor,
    tau: float,
    alpha: float = 1.0,
) -> torch.Tensor:
    """Mean over pixels of ``-log(sum_pos exp(s/tau) / sum_all exp(s/tau))`` with
    ``s = cos(f, p)`` (``alpha == 1``) or FedPLVM's ``s = max(cos, eps)^alpha``.

    Positives are the prototypes of the pixel's class, negatives every other prototype; pixels
    whose class has no prototype are skipped (zero loss, still connected to the graph)."""
    if len(prototypes) == 0 or len(features) == 0:
        return features.sum() * 0.0
    sim = F.normalize(features, dim=1) @ F.normalize(prototypes.to(features), dim=1).T
    if alpha != 1.0:
        # cos^alpha is undefined below 0 and has an infinite slope at 0: clamp (no gradient
        # below eps), as FedPLVM needs non-negative (post-ReLU) features anyway
        sim = sim.clamp(min=1e-4).pow(alpha)
    logits = sim / tau
    pos = classes[:, None] == proto_classes.to(classes.device)[None, :]
    has = pos.any(1)
    if not has.any():
        return features.sum() * 0.0
    logits, pos = logits[has], pos[has]
    num = torch.logsumexp(logits.masked_fill(~pos, float("-inf")), dim=1)
    return (torch.logsumexp(logits, dim=1) - num).mean()


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
    return centroids.float(), torch.bincount(assign, minlength=k)


class FeatureView(nn.Module):
    """A view of a network whose ``forward`` returns ``(logits, feature map at level)``; it
    owns no parameters (``.net`` is the network, as the optimiser-state helpers expect)."""

    def __init__(self, net: nn.Module, level: str) -> None:
        super().__init__()
        self.net, self.level = net, level

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, feats = named_features(self.net, x, [self.level])
        return logits, feats[self.level]


class ClusteredPrototypeConfig(MethodConfig):
    """Settings shared by the clustered-prototype baselines."""

    level: str = "dec1"
    """Feature map whose pixels are the samples (a UNet feature name, or a sub-module name)."""
    pixels: PositiveInt = 4096
    """Pixels per class per batch that enter the prototype loss (class-balanced cap)."""
    weight: float = Field(1.0, ge=0)
    """Weight of the prototype loss added to the segmentation loss."""
    tau: PositiveFloat = 0.1
    """InfoNCE temperature."""
    weighting: Weighting = "samples"
    """Model averaging: ``samples`` (FedBCS's protocol) or ``uniform``."""


PrototypeLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(pixel features [P, D], classes [P]) -> loss``."""


class ClusteredPrototypeMethod(Method):
    """All weights are shared and averaged (:func:`aggregation_weights`); payloads carry extra
    tensors whose names start with one of ``EXTRA``. Subclasses add the prototypes."""

    EXTRA: ClassVar[tuple[str, ...]] = ()
    config: ClusteredPrototypeConfig

    def weights(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model weights among payload ``tensors`` (without the prototype tensors)."""
        return {k: v for k, v in tensors.items() if not k.startswith(self.EXTRA)}

    def feature_dim(self, model: nn.Module) -> int:
        """Channels of the feature map ``level`` (one probe forward pass, cached)."""
        dim = getattr(self, "_dim", None)
        if dim is None:
            s, level = self.spec, self.config.level
            probe = torch.zeros(2, s.in_channels, *(32,) * s.ndim)
            was = model.training
            model.eval()
            try:
                with torch.no_grad():
                    _, feats = named_features(model, probe, [level])
            except ConfigError as e:
                raise ConfigError(f"method.level {level!r}: {e}") from None
            finally:
                model.train(was)
            dim = self._dim = int(feats[self.config.level].shape[1])
        return dim

    def average_weights(self, uploads: Mapping[str, Payload]) -> dict[str, torch.Tensor]:
        """Averaged model weights of ``uploads`` under ``weighting``."""
        w = aggregation_weights(uploads, self.config.weighting)
        first = next(iter(uploads.values()))
        return weighted_average(uploads, w, keys=self.weights(first.tensors))

    def train_round(self, ctx: ClientContext, loss: PrototypeLoss | None) -> dict[str, float]:
        """Local training: segmentation loss plus ``weight * loss`` on the class-balanced
        pixel sample of every batch (``loss=None``: segmentation loss only)."""
        cfg, spec = self.config, ctx.spec
        seg = segmentation_loss(ctx)
        proto_total = [0.0, 0]

        def total(out: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
            logits, feats = out
            value = seg(logits, labels)
            if loss is None or cfg.weight == 0:
                return value
            f, y = sample_pixels(feats, labels, spec.num_classes, cfg.pixels, ctx.generator)
            extra = loss(f, y)
            proto_total[0] += float(extra.detach())
            proto_total[1] += 1
            return value + cfg.weight * extra

        metrics = train_steps(FeatureView(ctx.model, cfg.level), ctx, total)  # type: ignore[arg-type]
        metrics["proto_loss"] = proto_total[0] / max(proto_total[1], 1)
        return metrics

    def feature_pass(self, ctx: ClientContext) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(features [B, D, *S], labels)`` of one ordered, un-augmented pass over the site's
        training data, in eval mode and without gradients (FedPLVM's extra pass)."""
        model = ctx.model
        model.eval()
        with torch.no_grad():
            for images, labels in ctx.ordered_batches():
                _, feats = named_features(model, images, [self.config.level])
                yield feats[self.config.level].detach(), labels
        model.train()
