"""Shared pieces of the feature-alignment baselines of FedBCS's Table 1 (MOON, FedProto, FPL,
FedUV): the feature width of a named level, label-free pixel sampling, a local-training loop
that adds per-batch feature terms and collects last-epoch prototypes, per-class gathering
of uploaded prototypes, and a base method whose payloads carry extra tensors besides weights.

Port of classification-feature methods to segmentation: a pixel is a sample, its feature is
the named level's vector at that pixel (``dec1``, the full-resolution map that feeds the
segmentation head, by default). Class-balanced pixel samples come from
:mod:`fedseg.methods.balanced` and the ``(logits, feature)`` view of a network from
:mod:`fedseg.methods.clustered_prototypes` (shared with FedContrast and FedPLVM), whose
setting names (``level``, ``pixels``, ``weighting``, ``balance``) these methods use too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from pydantic import PositiveInt
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.balanced import Balance
from fedseg.methods.base import (
    ClientContext,
    FederationSpec,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
    batches_per_epoch,
)
from fedseg.methods.clustered_prototypes import Weighting, aggregation_weights
from fedseg.methods.prototypes import PrototypeAccumulator, read_prototypes
from fedseg.methods.training import segmentation_loss, train_steps
from fedseg.models.features import named_features
from fedseg.models.registry import ModelConfig

__all__ = [
    "AlignmentConfig",
    "AlignmentMethod",
    "BalancedConfig",
    "Terms",
    "class_members",
    "feature_dim",
    "pixel_rows",
    "random_pixels",
    "train_with_terms",
]

Terms = Callable[[torch.Tensor, Any, torch.Tensor], dict[str, torch.Tensor]]
"""``(logits, features, labels) -> {name: weighted loss term}`` of one training batch."""


class AlignmentConfig(MethodConfig):
    """Settings every feature-alignment baseline shares."""

    level: str = "dec1"
    """Feature map whose pixels are the samples (a UNet feature name, or a sub-module name)."""
    pixels: PositiveInt = 4096
    """Pixels per class per batch that enter a per-pixel loss (a memory cap; MOON: pixels
    per batch, label-free). The class balance is ``balance`` (BalancedConfig)."""
    weighting: Weighting = "samples"
    """Model averaging: ``samples`` (FedBCS's protocol, and these papers' own) or
    ``uniform``."""


class BalancedConfig(AlignmentConfig):
    """Settings of the baselines whose losses average over labelled pixels."""

    balance: Balance = "classes"
    """Average of the per-pixel loss terms: ``classes`` (every class present in a batch
    weighs the same, the port rules' class-balanced sample at any resolution) or ``pixels``
    (plain mean over the sampled pixels, background-dominated when the per-class cap does
    not bind, e.g. at 32-64 px)."""


def feature_dim(model: nn.Module, spec: FederationSpec, level: str) -> int:
    """Channels of ``model``'s feature ``level`` (one probe forward pass on zeros, in eval
    mode, without gradients: no random numbers are drawn and nothing is updated)."""
    device = next(model.parameters()).device
    x = torch.zeros(2, spec.in_channels, *(32,) * spec.ndim, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, feats = named_features(model, x, [level])
    except ConfigError as e:
        raise ConfigError(f"method.level {level!r}: {e}") from None
    finally:
        model.train(was_training)
    return int(feats[level].shape[1])


def pixel_rows(t: torch.Tensor) -> torch.Tensor:
    """``[B, D, *S]`` -> ``[B * prod(S), D]``: one row per pixel (batch-major order)."""
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def random_pixels(
    n: int, cap: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Indices of ``min(n, cap)`` random pixels out of ``n`` (label-free sampling)."""
    if n <= cap:
        return torch.arange(n, device=device)
    return torch.randperm(n, generator=generator)[:cap].to(device)


def train_with_terms(
    view: nn.Module,
    ctx: ClientContext,
    terms: Terms,
    prototypes: PrototypeAccumulator | None = None,
) -> dict[str, float]:
    """:func:`~fedseg.methods.training.train_steps` on ``view`` (``x -> (logits, features)``)
    with the segmentation loss plus ``terms``; returns the mean loss and the mean of every
    term.

    With ``prototypes``, the features of the last local epoch's training batches (the last
    ``ceil(n / batch_size)`` steps, or all steps when fewer) are accumulated, detached, from
    the training forward pass itself (pre-step weights), as FedProto's and FPL's code do.
    """
    seg = segmentation_loss(ctx)
    steps = ctx.steps()
    first_collected = steps - min(
        steps, batches_per_epoch(ctx.site.num_train, ctx.train.batch_size)
    )
    sums: dict[str, float] = {}
    calls = 0

    def loss(out: tuple[torch.Tensor, Any], labels: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        logits, feats = out
        if prototypes is not None and calls >= first_collected:
            prototypes.add(feats, labels)
        calls += 1
        parts = terms(logits, feats, labels)
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach())
        return seg(logits, labels) + sum(parts.values(), torch.zeros((), device=logits.device))

    metrics = train_steps(view, ctx, loss)  # type: ignore[arg-type]
    return metrics | {k: v / max(steps, 1) for k, v in sums.items()}


def class_members(
    uploads: Mapping[str, Payload], name: str, num_classes: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per class, ``(prototypes [n_c, D], counts [n_c])`` of the uploads' prototype set
    ``name`` whose count for the class is > 0, in upload order (``n_c`` may be 0)."""
    sets = [read_prototypes(u.tensors, name) for u in uploads.values()]
    out = []
    for c in range(num_classes):
        held = [(p[c], n[c]) for p, n in sets if n[c] > 0]
        rows = torch.stack([p for p, _ in held]) if held else sets[0][0][:0]
        counts = torch.stack([n for _, n in held]) if held else sets[0][1][:0]
        out.append((rows, counts))
    return out


class AlignmentMethod(Method):
    """Base of the feature-alignment baselines: the partition's weights plus the method's
    ``extra_names`` tensors (prototypes, cluster centres) travel; the server averages the
    weights by sample count by default (FedAvg; FedBCS's supplement, Eq. 27, uses it for
    every method of its comparison, and MOON's, FedProto's (RethinkFL), FPL's and FedUV's
    code agree) or uniformly (``weighting: uniform``)."""

    Config = AlignmentConfig
    config: AlignmentConfig
    extra_names: ClassVar[tuple[str, ...]] = ()
    """Payload tensors that are not model weights."""

    def __init__(
        self, config: MethodConfig, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        self._dim: int | None = None

    def dim(self, model: nn.Module) -> int:
        """Channels of the configured feature layer of ``model`` (probed once)."""
        if self._dim is None:
            self._dim = feature_dim(model, self.spec, self.config.level)
        return self._dim

    def weights(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model weights among a payload's ``tensors``."""
        return {k: v for k, v in tensors.items() if k not in self.extra_names}

    def average(self, uploads: Mapping[str, Payload]) -> dict[str, torch.Tensor]:
        """Average of the uploaded weights under ``weighting``."""
        first = next(iter(uploads.values()))
        w = aggregation_weights(uploads, self.config.weighting)
        return weighted_average(uploads, w, keys=self.weights(first.tensors))

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        """FedAvg of the weights (methods with extra tensors extend it)."""
        payload = Payload(self.average(uploads))
        return ServerResult({s.name: payload for s in ctx.spec.sites}, state)
