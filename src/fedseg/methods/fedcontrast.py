"""FedContrast-GPA (Zhou & Zheng, MICCAI 2023) as a baseline of FedBCS's Table 1: every site
clusters its pixel features into a fixed number of local prototypes (9 per site, as FedBCS's
Table 3 reports), uploads them with its weights, and trains with an intra-client and an
inter-client prototype InfoNCE. No code of the paper is public; see docs/methods/fedcontrast.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.alignment import AlignmentMethod, BalancedConfig, train_with_terms
from fedseg.methods.balanced import sample_pixels
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
)
from fedseg.methods.clustered_prototypes import (
    FeatureView,
    feature_pass,
    kmeans,
    prototype_infonce,
)
from fedseg.methods.prototypes import prototype_spec, prototype_tensors, read_prototypes
from fedseg.methods.registry import register_method
from fedseg.models.registry import ModelConfig

__all__ = ["FedContrast", "allocate_prototypes"]


def allocate_prototypes(total: int, num_classes: int) -> list[int]:
    """Clusters per class for ``total`` prototypes: an equal share each, the remainder to the
    foreground classes from class 1 on (9 over 2 classes: 4 background, 5 foreground)."""
    if total < num_classes:
        raise ConfigError(
            f"method.prototypes must be >= the number of classes ({num_classes}), got {total}"
        )
    share = [total // num_classes] * num_classes
    fg = list(range(1, num_classes)) or [0]
    for i in range(total - sum(share)):
        share[fg[i % len(fg)]] += 1
    return share


@register_method("fedcontrast")
class FedContrast(AlignmentMethod):
    """FedAvg plus local clustered prototypes and prototype contrast.

    After local training each site runs one ordered pass, samples pixel features per class
    and clusters them with k-means into ``per_class[c]`` prototypes (9 in all by default). It
    uploads them (``protos`` ``[9, D]`` + member counts; an empty cluster is a zero row with
    count 0). The server averages the weights and sends every site the prototypes of all
    *other* sites (``peers``). Local training adds, on a pixel sample of each batch,
    ``intra_weight * InfoNCE(own prototypes of the previous round)`` + ``inter_weight *
    InfoNCE(peer prototypes)``: same-class prototypes are positives, the others negatives;
    each InfoNCE is averaged per class, then over classes (``balance``).

    Reference: Zhou & Zheng, "FedContrast-GPA: Heterogeneous Federated Optimization via Local
    Contrastive Learning and Global Process-Aware Aggregation", MICCAI 2023.
    """

    class Config(BalancedConfig):
        """FedContrast settings (``level``, ``pixels``, ``weighting``, ``balance``: see
        BalancedConfig)."""

        prototypes: PositiveInt = 9
        """Local prototypes per site (FedBCS Table 3: 9), split over the classes."""
        per_class: tuple[PositiveInt, ...] | None = None
        """Explicit clusters per class (overrides the split of ``prototypes``)."""
        cluster_pixels: PositiveInt = 512
        """Pixels per class per batch of the ordered pass that enter k-means."""
        kmeans_iters: PositiveInt = 20
        intra_weight: float = Field(1.0, ge=0)
        """Weight of the contrast with the site's own prototypes of its previous round."""
        inter_weight: float = Field(1.0, ge=0)
        """Weight of the contrast with the other sites' prototypes."""
        weight: float = Field(1.0, ge=0)
        """Weight of the whole prototype loss added to the segmentation loss."""
        tau: PositiveFloat = 0.1
        """InfoNCE temperature."""

    config: Config
    extra_names = ("protos", "protos.count", "peers", "peers.label")
    summary = (
        "FedContrast: FedAvg + 9 k-means pixel prototypes per site (FedBCS Table 3), "
        "intra- and inter-client prototype InfoNCE"
    )

    def __init__(
        self, config: Config, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        k = spec.num_classes
        if config.per_class is not None:
            if len(config.per_class) != k:
                raise ConfigError(
                    f"method.per_class needs one count per class ({k}), got "
                    f"{list(config.per_class)}"
                )
            self.allocation = list(config.per_class)
        else:
            self.allocation = allocate_prototypes(config.prototypes, k)
        self.proto_classes = torch.repeat_interleave(torch.arange(k), torch.tensor(self.allocation))
        """Class of each uploaded prototype row."""

    # -- templates -------------------------------------------------------------------------
    def upload_template(self, model: nn.Module) -> Template:
        n = len(self.proto_classes)
        return {
            **super().upload_template(model),
            **prototype_spec("protos", n, self.dim(model)),
        }

    def download_template(self, model: nn.Module) -> Template:
        return {
            **super().download_template(model),
            "peers": TensorSpec((None, self.dim(model)), torch.float32),
            "peers.label": TensorSpec((None,), torch.int64),
        }

    def init_server(self, model: nn.Module) -> ServerResult:
        out = super().init_server(model)
        first = next(iter(out.payloads.values()))
        empty = {
            "peers": torch.zeros(0, self.dim(model)),
            "peers.label": torch.zeros(0, dtype=torch.long),
        }
        glob = Payload({**first.tensors, **empty})
        return ServerResult(dict.fromkeys(out.payloads, glob), {})

    # -- client ----------------------------------------------------------------------------
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        cfg = self.config
        self.load(ctx.model, Payload(self.weights(payload.tensors)), state)
        peers = (payload.tensors["peers"], payload.tensors["peers.label"])
        own = self._nonempty(state["own"], state["own.count"]) if "own" in state else None

        active = cfg.weight > 0 and (len(peers[0]) > 0 or own is not None)

        def terms(
            _: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            if not active:
                return {}
            f, y = sample_pixels(feats, labels, ctx.spec.num_classes, cfg.pixels, ctx.generator)
            value = cfg.inter_weight * prototype_infonce(f, y, *peers, cfg.tau, 1.0, cfg.balance)
            if own is not None:
                intra = prototype_infonce(f, y, *own, cfg.tau, 1.0, cfg.balance)
                value = value + cfg.intra_weight * intra
            return {"proto_loss": cfg.weight * value}

        metrics = train_with_terms(FeatureView(ctx.model, cfg.level), ctx, terms)
        protos, counts = self.local_prototypes(ctx)
        upload, private = self.split(ctx.model)
        upload |= prototype_tensors("protos", protos, counts)
        private |= {"own": protos, "own.count": counts}
        metrics["prototypes"] = float((counts > 0).sum())
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def local_prototypes(self, ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prototypes [M, D], member counts [M])``: k-means of each class's sampled pixel
        features of one ordered pass; rows of clusters that got no member are zero."""
        cfg, k = self.config, ctx.spec.num_classes
        pools: list[list[torch.Tensor]] = [[] for _ in range(k)]
        for feats, labels in feature_pass(ctx.model, ctx, cfg.level):
            f, y = sample_pixels(feats, labels, k, cfg.cluster_pixels, ctx.generator)
            for c in range(k):
                pools[c].append(f[y == c].float().cpu())
        dim = self.dim(ctx.model)
        rows = torch.zeros(len(self.proto_classes), dim)
        counts = torch.zeros(len(self.proto_classes), dtype=torch.long)
        start = 0
        for c, n in enumerate(self.allocation):
            points = torch.cat(pools[c]) if pools[c] else torch.zeros(0, dim)
            centroids, members = kmeans(points, n, ctx.generator, cfg.kmeans_iters)
            rows[start : start + len(centroids)] = centroids
            counts[start : start + len(centroids)] = members
            start += n
        rows[counts == 0] = 0.0
        return rows, counts

    def _nonempty(
        self, protos: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keep = counts > 0
        return protos[keep], self.proto_classes[keep]

    # -- server ----------------------------------------------------------------------------
    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        weights = self.average(uploads)
        local = {
            s: self._nonempty(*read_prototypes(u.tensors, "protos")) for s, u in uploads.items()
        }
        dim = next(iter(uploads.values())).tensors["protos"].shape[1]
        payloads = {}
        for site in ctx.spec.site_names:
            others = [v for s, v in local.items() if s != site]
            peers = torch.cat([p for p, _ in others]) if others else torch.zeros(0, dim)
            labels = (
                torch.cat([c for _, c in others]) if others else torch.zeros(0, dtype=torch.long)
            )
            payloads[site] = Payload({**weights, "peers": peers, "peers.label": labels})
        sent = {s: len(p) for s, (p, _) in local.items()}
        return ServerResult(payloads, state, {"prototypes": sent})
