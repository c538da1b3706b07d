"""FPL (Huang et al., CVPR 2023): federated prototype learning with cluster prototypes.

Sites upload per-class prototypes; the server clusters each class's site prototypes with
FINCH and sends back the cluster centres. Local training adds the cluster-prototype
contrast ``L_xi`` (positives: the pixel's class's centres; negatives: every other class's
centres) and the unbiased-prototype consistency ``L_cu`` (MSE to the mean of the class's
centres). Weights are FedAvg-averaged by sample count.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field, PositiveFloat
from torch import nn

from fedseg.methods.alignment import (
    AlignmentMethod,
    BalancedConfig,
    class_members,
    train_with_terms,
)
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
from fedseg.methods.clustered_prototypes import FeatureView, infonce_rows
from fedseg.methods.finch import finch_clusters
from fedseg.methods.prototypes import (
    PrototypeAccumulator,
    prototype_spec,
    prototype_tensors,
    read_prototypes,
)
from fedseg.methods.registry import register_method

__all__ = ["FPL", "cluster_prototypes", "fpl_losses", "unbiased_prototypes"]

PROTOS, CENTRES = "protos", "centres"
CLASS = f"{CENTRES}.class"


def cluster_prototypes(
    members: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FPL's server step on per-class site prototypes (:func:`class_members`):
    ``(centres [M, D], members per centre [M], class of each centre [M])``. A class held by
    one site keeps its prototype; two or more are clustered with FINCH (cosine, last
    partition, unweighted means)."""
    dim = members[0][0].shape[1]
    centres, sizes, classes = [torch.zeros(0, dim)], [], []
    for c, (rows, _) in enumerate(members):
        if len(rows) == 0:
            continue
        labels, cents = finch_clusters(rows)
        centres.append(cents)
        sizes.append(torch.bincount(labels, minlength=len(cents)))
        classes.append(torch.full((len(cents),), c, dtype=torch.long))
    empty = torch.zeros(0, dtype=torch.long)
    return torch.cat(centres), torch.cat(sizes or [empty]), torch.cat(classes or [empty])


def unbiased_prototypes(
    centres: torch.Tensor, classes: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """FPL's unbiased prototype of every class: the unweighted mean of its cluster centres
    (not of the site prototypes); ``([K, D], centres per class [K])``."""
    sums = torch.zeros(num_classes, centres.shape[1], dtype=centres.dtype, device=centres.device)
    sums.index_add_(0, classes, centres)
    counts = torch.bincount(classes, minlength=num_classes)
    return sums / counts.clamp(min=1)[:, None].to(sums), counts


def fpl_losses(
    features: torch.Tensor,
    classes: torch.Tensor,
    centres: torch.Tensor,
    centre_class: torch.Tensor,
    num_classes: int,
    tau: float,
    balance: Balance = "classes",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L_xi, L_cu)`` of pixel features ``[N, D]`` with classes ``[N]``.

    Per pixel ``L_xi = -log(sum_{p in P_y} e^{cos(f,p)/tau} / sum_{p in all} e^{cos(f,p)/tau})``
    and ``L_cu = mean_d (f - mean(P_y))^2``, both 0 for a pixel whose class has no centres
    (FPL divides by the whole batch); averaged over all N pixels with
    :func:`~fedseg.methods.balanced.balanced_mean` (``balance``)."""
    zero = features.sum() * 0
    has = torch.isin(classes, centre_class)
    if len(centres) == 0 or not has.any():
        return zero, zero
    xi, _ = infonce_rows(features, classes, centres, centre_class, tau)
    unbiased, _ = unbiased_prototypes(centres, centre_class, num_classes)
    cu = (features - unbiased[classes]).pow(2).mean(1) * has
    return balanced_mean(xi, classes, balance), balanced_mean(cu, classes, balance)


@register_method("fpl")
class FPL(AlignmentMethod):
    """FedAvg plus FINCH cluster prototypes, their contrast L_xi and the unbiased-prototype
    consistency L_cu.

    Reference: Huang, Ye, Shi, Li and Du, "Rethinking Federated Learning with Domain Shift:
    A Prototype View", CVPR 2023.
    """

    class Config(BalancedConfig):
        """FPL settings (see docs/methods/fpl.md)."""

        tau: PositiveFloat = 0.02
        """Temperature of L_xi (reference code ``infoNCET``: 0.02)."""
        xi_weight: float = Field(1.0, ge=0)
        """Weight of the cluster-prototype contrast L_xi (paper: 1)."""
        cu_weight: float = Field(1.0, ge=0)
        """Weight of the unbiased-prototype consistency L_cu (paper: 1)."""

    config: Config
    extra_names = (PROTOS, f"{PROTOS}.count", CENTRES, f"{CENTRES}.count", CLASS)
    summary = "FPL: FINCH cluster prototypes, contrast + unbiased-prototype MSE (+ FedAvg)"

    def upload_template(self, model: nn.Module) -> Template:
        k = self.spec.num_classes
        return {**super().upload_template(model), **prototype_spec(PROTOS, k, self.dim(model))}

    def download_template(self, model: nn.Module) -> Template:
        return {
            **super().download_template(model),
            **prototype_spec(CENTRES, None, self.dim(model)),
            CLASS: TensorSpec((None,), torch.int64),
        }

    def init_server(self, model: nn.Module) -> ServerResult:
        out = super().init_server(model)
        none = torch.zeros(0, dtype=torch.long)
        extra = prototype_tensors(CENTRES, torch.zeros(0, self.dim(model)), none) | {CLASS: none}
        first = Payload({**next(iter(out.payloads.values())).tensors, **extra})
        return ServerResult(dict.fromkeys(out.payloads, first), out.state)

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model, cfg, spec = ctx.model, self.config, ctx.spec
        self.load(model, Payload(self.weights(payload.tensors)), state)
        centres = read_prototypes(payload.tensors, CENTRES)[0].to(ctx.device)
        centre_class = payload.tensors[CLASS].to(ctx.device)

        def terms(
            logits: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            f, y = sample_pixels(feats, labels, spec.num_classes, cfg.pixels, ctx.generator)
            l_xi, l_cu = fpl_losses(
                f, y, centres, centre_class, spec.num_classes, cfg.tau, cfg.balance
            )
            return {"l_xi": cfg.xi_weight * l_xi, "l_cu": cfg.cu_weight * l_cu}

        acc = PrototypeAccumulator(spec.num_classes, spec.ignore_index)
        metrics = train_with_terms(FeatureView(model, cfg.level), ctx, terms, acc)
        protos, pixel_counts = acc.result()
        metrics["prototypes"] = float((pixel_counts > 0).sum())
        upload, private = self.split(model)
        upload |= prototype_tensors(PROTOS, protos, pixel_counts)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        centres, sizes, classes = cluster_prototypes(
            class_members(uploads, PROTOS, ctx.spec.num_classes)
        )
        extra = prototype_tensors(CENTRES, centres, sizes) | {CLASS: classes}
        payload = Payload({**self.average(uploads), **extra})
        per_class = torch.bincount(classes, minlength=ctx.spec.num_classes).tolist()
        return ServerResult(
            {s.name: payload for s in ctx.spec.sites}, state, {"centres_per_class": per_class}
        )
