"""Adaptive aggregation weights (AAW; Pan et al., ICASSP 2025) on top of FedAvg and FedProx.

Aggregation weights start at the sample-size proportions and move, after each aggregation,
by the normalised validation-loss gap ``G_i = Q_i - P_i`` between the new aggregate (Q) and
site i's local model (P) on site i's validation split (paper Eqs. 4-7, Algorithm 1). Timing
and decisions: ``docs/methods/aaw.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from fedseg.errors import ConfigError, UploadError
from fedseg.methods.aggregate import sample_weights, weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.fedprox import FedProx
from fedseg.methods.registry import register_method
from fedseg.methods.training import LossFn, segmentation_loss

__all__ = [
    "GLOBAL_LOSS",
    "LOCAL_LOSS",
    "AAWConfig",
    "AdaptiveWeights",
    "FedAvgAAW",
    "FedProxAAW",
    "step_size",
    "update_weights",
    "validation_loss",
]

log = logging.getLogger(__name__)

GLOBAL_LOSS = "val_loss_global"
"""Upload metric: validation loss of the received aggregate (Q of the previous aggregation)."""
LOCAL_LOSS = "val_loss_local"
"""Upload metric: validation loss of the site's model after local training (P)."""


# -- the weight update (pure functions) ---------------------------------------------------
def step_size(t: int, total: int, base: float = 0.1) -> float:
    """The paper's step ``s_t = base * (1 - t / T)`` for the update after aggregation ``t``."""
    return base * (1.0 - t / max(total, 1))


def update_weights(
    weights: Mapping[str, float],
    gaps: Mapping[str, float],
    step: float,
    *,
    center: bool = False,
) -> dict[str, float]:
    """One AAW update (Eq. 7, Alg. 1 lines 13-19): ``a_i += step * G_i / max_j |G_j|``,
    clip to [0, 1], renormalise.

    Args:
        weights: current weight of every site (summing to 1).
        gaps: ``G_i = Q_i - P_i`` of the sites that reported both losses; sites without a gap
            get ``G_i = 0`` (they move only through the renormalisation).
        step: the step size ``s_t``.
        center: subtract the mean gap first (FedDG-GA paper); off in the pancreas paper.

    Returns:
        The new weights. If every gap is zero, or clipping zeroes every weight, the input
        weights are returned unchanged.
    """
    unknown = sorted(set(gaps) - set(weights))
    if unknown:
        raise ValueError(
            f"gaps name sites without a weight: {unknown}; weights has {list(weights)}"
        )
    g = dict(gaps)
    if center and g:
        mean = math.fsum(g.values()) / len(g)
        g = {s: v - mean for s, v in g.items()}
    scale = max((abs(v) for v in g.values()), default=0.0)
    if scale == 0.0:
        return dict(weights)
    clipped = {s: min(max(a + step * g.get(s, 0.0) / scale, 0.0), 1.0) for s, a in weights.items()}
    total = math.fsum(clipped.values())
    if total == 0.0:
        log.warning("AAW update clipped every weight to 0; keeping the previous weights")
        return dict(weights)
    return {s: a / total for s, a in clipped.items()}


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    val: tuple[torch.Tensor, torch.Tensor],
    loss_fn: LossFn,
    batch_size: int,
) -> float:
    """Mean per-sample loss of ``model`` (eval mode) over a validation split (paper Eq. 1)."""
    images, labels = val
    model.eval()
    total = 0.0
    for i in range(0, len(images), batch_size):
        logits = model(images[i : i + batch_size])
        y = labels[i : i + batch_size]
        total += sum(float(loss_fn(logits[j : j + 1], y[j : j + 1])) for j in range(len(y)))
    return total / len(images)


# -- the method --------------------------------------------------------------------------
class AAWConfig(MethodConfig):
    """Settings of the adaptive aggregation weights (combined with the base method's)."""

    step: float = Field(0.1, gt=0.0, le=1.0)
    """Initial step size ``s_0``; the update after aggregation t uses ``s_0 (1 - t/T)``."""
    center_gaps: bool = False
    """Subtract the mean gap before normalising (FedDG-GA paper); off as in the pancreas paper."""
    initial: Literal["samples", "uniform"] = "samples"
    """Initial weights: training-sample proportions (paper Eq. 5) or 1/K (FedDG-GA code)."""


class AdaptiveWeights:
    """Mixin turning a FedAvg-style method into its AAW variant.

    Client step: evaluate the received aggregate on the validation split (Q), run the base
    method's local step, evaluate the resulting local model (P); both travel as upload
    metrics. Server step: pair this round's Q with the P each site reported in the previous
    round, update the weights, aggregate with them, keep this round's P for the next round.
    """

    config: AAWConfig
    spec: Any

    def init_server(self, model: nn.Module) -> ServerResult:
        result = super().init_server(model)  # type: ignore[misc]
        sites = self.spec.sites
        if self.config.initial == "uniform":
            weights = {s.name: 1.0 / len(sites) for s in sites}
        else:
            total = sum(s.num_train for s in sites)
            weights = {s.name: s.num_train / total for s in sites}
        result.state["aaw"] = {"weights": weights, "local_loss": {}}
        return result

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        if ctx.val is None or len(ctx.val[0]) == 0:
            raise ConfigError(
                f"site {ctx.site.name!r} has no validation split, but adaptive aggregation "
                "weights need one per site (val samples > 0 in the federation manifest); "
                "create the federation with a val split"
            )
        loss_fn = segmentation_loss(ctx)
        bs = ctx.train.batch_size
        self.load(ctx.model, payload, state)  # type: ignore[attr-defined]
        q = validation_loss(ctx.model, ctx.val, loss_fn, bs)
        res = super().client_step(payload, state, ctx)  # type: ignore[misc]
        self.load(ctx.model, Payload(res.upload.tensors), res.state)  # type: ignore[attr-defined]
        p = validation_loss(ctx.model, ctx.val, loss_fn, bs)
        res.upload.metrics.update({GLOBAL_LOSS: q, LOCAL_LOSS: p})
        res.metrics.update({GLOBAL_LOSS: q, LOCAL_LOSS: p})
        return res

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        for site, up in uploads.items():
            missing = [k for k in (GLOBAL_LOSS, LOCAL_LOSS) if k not in up.metrics]
            if missing:
                raise UploadError(
                    f"site {site!r}: AAW upload metrics must include {missing}, "
                    f"got {sorted(up.metrics)}"
                )
        aaw = state["aaw"]
        weights: dict[str, float] = dict(aaw["weights"])
        previous: dict[str, float] = aaw["local_loss"]
        gaps = {
            s: u.metrics[GLOBAL_LOSS] - previous[s] for s, u in uploads.items() if s in previous
        }
        step = None
        if gaps:
            step = step_size(ctx.round - 1, ctx.train.rounds, self.config.step)
            weights = update_weights(weights, gaps, step, center=self.config.center_gaps)
        payload = Payload(weighted_average(uploads, _participant_weights(weights, uploads)))
        local_loss = {s: u.metrics[LOCAL_LOSS] for s, u in uploads.items()}
        new_state = {**state, "aaw": {"weights": weights, "local_loss": local_loss}}
        metrics = {"aaw_weights": weights, "aaw_gaps": gaps, "aaw_step": step}
        return ServerResult({s.name: payload for s in ctx.spec.sites}, new_state, metrics)


def _participant_weights(
    weights: Mapping[str, float], uploads: Mapping[str, Payload]
) -> dict[str, float]:
    """The global weights restricted to the sites that replied and renormalised."""
    total = math.fsum(weights[s] for s in uploads)
    if total == 0.0:
        log.warning("every participating site has AAW weight 0; using sample weights this round")
        return sample_weights(uploads)
    return {s: weights[s] / total for s in uploads}


@register_method("fedavg_aaw")
class FedAvgAAW(AdaptiveWeights, FedAvg):
    """FedAvg with adaptive aggregation weights (Pan et al., "Adaptive Aggregation Weights
    for Federated Segmentation of Pancreas MRI", ICASSP 2025, arXiv 2410.22530)."""

    class Config(AAWConfig, FedAvg.Config):  # type: ignore[misc,name-defined]
        """FedAvg's settings plus those of the adaptive aggregation weights."""

    summary = "FedAvg+AAW: aggregation weights adapted by validation-loss gaps (Pan et al.)"


@register_method("fedprox_aaw")
class FedProxAAW(AdaptiveWeights, FedProx):
    """FedProx local training with adaptive aggregation weights (Pan et al., ICASSP 2025)."""

    class Config(AAWConfig, FedProx.Config):  # type: ignore[misc,name-defined]
        """FedProx's settings (``mu``) plus those of the adaptive aggregation weights."""

    summary = "FedProx+AAW: proximal local training, validation-gap adaptive weights"
