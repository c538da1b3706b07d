"""FedPLVM (Wang et al., NeurIPS 2024) as a baseline of FedBCS's Table 1: variance-aware
dual-level prototype clustering (FINCH on each site, then FINCH on the server) and the
alpha-sparsity prototype loss. See docs/methods/fedplvm.md for the port to segmentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch import nn

from fedseg.methods.alignment import AlignmentMethod, BalancedConfig, train_with_terms
from fedseg.methods.balanced import Balance, balanced_mean, sample_pixels
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
)
from fedseg.methods.clustered_prototypes import (
    FeatureView,
    Weighting,
    feature_pass,
    prototype_infonce,
)
from fedseg.methods.finch import finch_clusters
from fedseg.methods.prototypes import class_sums, prototype_spec, prototype_tensors
from fedseg.methods.registry import register_method

__all__ = ["FedPLVM", "correction_loss", "finch_per_class", "image_class_means"]


def correction_loss(
    features: torch.Tensor,
    classes: torch.Tensor,
    means: torch.Tensor,
    counts: torch.Tensor,
    balance: Balance = "classes",
) -> torch.Tensor:
    """FedPLVM's ``2 * MSE(cos(f, mean prototype of f's class), 1)`` over the pixels whose
    class has a mean prototype (``counts > 0``), averaged with
    :func:`~fedseg.methods.balanced.balanced_mean`."""
    valid = counts.to(classes.device)[classes] > 0
    if not valid.any():
        return features.sum() * 0.0
    target = means.to(features)[classes[valid]]
    cos = F.cosine_similarity(features[valid], target, dim=1)
    return 2.0 * balanced_mean((cos - 1.0).pow(2), classes[valid], balance)


def finch_per_class(
    vectors: torch.Tensor, classes: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(centroids [M, D], their classes [M])``: FINCH (last partition, unweighted means) of
    each class's vectors; a class without vectors gives none."""
    out, labels = [], []
    for c in range(num_classes):
        members = vectors[classes == c]
        if len(members):
            _, centroids = finch_clusters(members)
            out.append(centroids)
            labels.append(torch.full((len(centroids),), c, dtype=torch.long))
    if not out:
        return vectors.new_zeros(0, vectors.shape[1]).float(), torch.zeros(0, dtype=torch.long)
    return torch.cat(out), torch.cat(labels)


def image_class_means(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means [M, D], classes [M])``: one mean feature per image and class present in it."""
    means, classes = [], []
    for i in range(len(features)):
        sums, counts = class_sums(features[i : i + 1], labels[i : i + 1], num_classes, ignore_index)
        seen = counts > 0
        means.append(sums[seen] / counts[seen, None])
        classes.append(torch.arange(num_classes, device=counts.device)[seen])
    return torch.cat(means), torch.cat(classes)


@register_method("fedplvm")
class FedPLVM(AlignmentMethod):
    """FedAvg plus dual-level clustered prototypes and the alpha-sparsity prototype loss.

    After local training each site runs one ordered pass in eval mode and clusters its pixel
    features of each class with FINCH (per batch by default, see ``cluster_unit``); it
    uploads all local cluster centres (a variable number: ``local_protos`` ``[M, D]`` and
    their classes). The server pools them per class, runs FINCH again and sends every site
    the global cluster centres and, per class, their unweighted mean. From then on local
    training adds ``weight * (L_alpha + L_corr)``: an InfoNCE over all global centres with
    similarity ``cos^alpha`` and ``2 * MSE(cos(f, class mean), 1)``.

    Reference: Wang et al., "Taming Cross-Domain Representation Variance in Federated
    Prototype Learning with Heterogeneous Data Domains", NeurIPS 2024.
    """

    class Config(BalancedConfig):
        """FedPLVM settings (code defaults alpha 0.25, tau 0.07; ``level``, ``pixels``:
        see AlignmentConfig)."""

        alpha: float = Field(0.25, gt=0, le=1)
        """Exponent of the alpha-sparsity similarity ``cos^alpha`` (1: plain InfoNCE)."""
        tau: float = Field(0.07, gt=0)
        weight: float = Field(1.0, ge=0)
        """lambda of ``L = L_seg + lambda (L_alpha + L_corr)`` (FedPLVM's code: 100 on CE)."""
        cluster_unit: Literal["batch", "site"] = "batch"
        """``batch``: FINCH on each batch's sampled pixel features of a class, all centres
        uploaded (counts grow with the site's size, as FedBCS Table 3); ``site``: one FINCH
        per class over the per-image class means of the whole pass."""
        cluster_pixels: PositiveInt = 1024
        """Pixels per class per batch that enter local FINCH (``cluster_unit: batch``)."""
        weighting: Weighting = "samples"
        """``samples`` (FedBCS's protocol) or ``uniform`` (FedPLVM's code, label-iid)."""

    config: Config
    extra_names = (
        "local_protos",
        "local_protos.label",
        "global_protos",
        "global_protos.label",
        "mean_protos",
        "mean_protos.count",
    )
    summary = (
        "FedPLVM: FedAvg + local and global FINCH prototype clustering (variable count per "
        "site), alpha-sparsity prototype loss"
    )

    # -- templates -------------------------------------------------------------------------
    def upload_template(self, model: nn.Module) -> Template:
        d = self.dim(model)
        return {
            **super().upload_template(model),
            "local_protos": TensorSpec((None, d), torch.float32),
            "local_protos.label": TensorSpec((None,), torch.int64),
        }

    def download_template(self, model: nn.Module) -> Template:
        d = self.dim(model)
        return {
            **super().download_template(model),
            "global_protos": TensorSpec((None, d), torch.float32),
            "global_protos.label": TensorSpec((None,), torch.int64),
            **prototype_spec("mean_protos", self.spec.num_classes, d),
        }

    def init_server(self, model: nn.Module) -> ServerResult:
        out = super().init_server(model)
        first = next(iter(out.payloads.values()))
        d, k = self.dim(model), self.spec.num_classes
        glob = Payload(
            {
                **first.tensors,
                "global_protos": torch.zeros(0, d),
                "global_protos.label": torch.zeros(0, dtype=torch.long),
                **prototype_tensors(
                    "mean_protos", torch.zeros(k, d), torch.zeros(k, dtype=torch.long)
                ),
            }
        )
        return ServerResult(dict.fromkeys(out.payloads, glob), {})

    # -- client ----------------------------------------------------------------------------
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        cfg, t = self.config, payload.tensors
        self.load(ctx.model, Payload(self.weights(t)), state)
        glob, glob_cls = t["global_protos"], t["global_protos.label"]
        means, counts = t["mean_protos"], t["mean_protos.count"]

        active = cfg.weight > 0 and len(glob) > 0

        def terms(
            _: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            if not active:
                return {}
            f, y = sample_pixels(feats, labels, ctx.spec.num_classes, cfg.pixels, ctx.generator)
            sparse = prototype_infonce(f, y, glob, glob_cls, cfg.tau, cfg.alpha, cfg.balance)
            corr = correction_loss(f, y, means, counts, cfg.balance)
            return {"proto_loss": cfg.weight * (sparse + corr)}

        metrics = train_with_terms(FeatureView(ctx.model, cfg.level), ctx, terms)
        local, local_cls = self.local_clusters(ctx)
        upload, private = self.split(ctx.model)
        upload |= {"local_protos": local.float().cpu(), "local_protos.label": local_cls.cpu()}
        metrics["prototypes"] = float(len(local))
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def local_clusters(self, ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``(local cluster centres [M, D], classes [M])`` of one ordered pass."""
        cfg, k = self.config, ctx.spec.num_classes
        points, classes = [], []
        for feats, labels in feature_pass(ctx.model, ctx, cfg.level):
            if cfg.cluster_unit == "batch":
                f, y = sample_pixels(feats, labels, k, cfg.cluster_pixels, ctx.generator)
                f, y = finch_per_class(f.float().cpu(), y.cpu(), k)
            else:
                f, y = image_class_means(feats, labels, k, ctx.spec.ignore_index)
            points.append(f.float().cpu())
            classes.append(y.cpu())
        f, y = torch.cat(points), torch.cat(classes)
        return finch_per_class(f, y, k) if cfg.cluster_unit == "site" else (f, y)

    # -- server ----------------------------------------------------------------------------
    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        k = self.spec.num_classes
        weights = self.average(uploads)
        local = torch.cat([u.tensors["local_protos"] for u in uploads.values()])
        local_cls = torch.cat([u.tensors["local_protos.label"] for u in uploads.values()])
        glob, glob_cls = finch_per_class(local, local_cls, k)
        counts = torch.bincount(glob_cls, minlength=k)
        means = torch.zeros(k, local.shape[1])
        means.index_add_(0, glob_cls, glob)
        means[counts > 0] /= counts[counts > 0, None]
        payload = Payload(
            {
                **weights,
                "global_protos": glob,
                "global_protos.label": glob_cls,
                **prototype_tensors("mean_protos", means, counts),
            }
        )
        sent = {s: len(u.tensors["local_protos"]) for s, u in uploads.items()}
        metrics = {"prototypes": sent, "global_prototypes": len(glob)}
        return ServerResult(dict.fromkeys(ctx.spec.site_names, payload), state, metrics)
