"""FedAP (Lu et al., IEEE TBD 2022): aggregation weights from BN-statistics similarity."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from pydantic import Field
from torch import nn

from fedseg.methods.aggregate import mix_states, weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
)
from fedseg.methods.fedbn import FedBN
from fedseg.methods.registry import register_method

__all__ = ["FedAP", "bn_input_stats", "fedap_weights"]

log = logging.getLogger(__name__)

BN_TYPES = (nn.BatchNorm2d, nn.BatchNorm3d)
STAT = "fedap_stats."
"""Prefix of the upload tensors that carry a site's BN-input statistics."""
REQUEST = "fedap_request_stats"
"""Payload metric: 1 when the server asks the sites for their BN-input statistics."""

BNStats = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""BN layer name -> (channel means, channel variances) of the layer's input."""


@torch.no_grad()
def bn_input_stats(
    model: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], n_batches: int
) -> BNStats:
    """Channel mean and unbiased variance of every BN layer's *input* over ``n_batches``
    batches, pooled exactly across batches; the model runs in eval mode (as in FedAP)."""
    acc: dict[str, torch.Tensor] = {}  # layer -> [sum; sum of squares; count] per channel

    def recorder(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def record(_: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].transpose(0, 1).flatten(1).double()
            count = torch.full_like(x[:, 0], x.shape[1])
            row = torch.stack([x.sum(1), (x * x).sum(1), count])
            acc[name] = acc[name] + row if name in acc else row

        return record

    handles = [
        m.register_forward_pre_hook(recorder(name))
        for name, m in model.named_modules()
        if isinstance(m, BN_TYPES)
    ]
    was_training = model.training
    model.eval()
    try:
        for _ in range(n_batches):
            model(next(batches)[0])
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = {}
    for name, (total, squares, n) in acc.items():
        mean = total / n
        var = (squares - n * mean * mean) / (n - 1).clamp(min=1)
        out[name] = (mean.float(), var.clamp(min=0).float())
    return out


def fedap_weights(
    stats: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor]]], momentum: float
) -> torch.Tensor:
    """FedAP's aggregation matrix ``W`` (rows: receiving site, columns: contributing site).

    ``d(i, j) = sum_l sqrt(||mu_i^l - mu_j^l||^2 + ||sigma_i^l - sigma_j^l||^2)`` (the
    2-Wasserstein distance between diagonal Gaussians, summed over BN layers); off-diagonal
    ``W[i, j]`` proportional to ``1 / d(i, j)``, scaled so each row's off-diagonal sums to
    ``1 - momentum``; ``W[i, i] = momentum``. Every row sums to 1.
    """
    k = len(stats)
    if k == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    layers = list(stats[0])
    if any(list(s) != layers for s in stats):
        raise ValueError("fedap_weights: every site must report the same BN layers")
    dist = torch.zeros(k, k, dtype=torch.float64)
    for i in range(k):
        for j in range(i + 1, k):
            d = 0.0
            for layer in layers:
                (mi, vi), (mj, vj) = stats[i][layer], stats[j][layer]
                dm = (mi.double() - mj.double()).pow(2).sum()
                ds = (vi.double().sqrt() - vj.double().sqrt()).pow(2).sum()
                d += math.sqrt(float(dm + ds))
            dist[i, j] = dist[j, i] = d
    affinity = 1.0 / dist.clamp(min=1e-14)
    affinity.fill_diagonal_(0.0)
    w = affinity / affinity.sum(1, keepdim=True) * (1.0 - momentum)
    w.fill_diagonal_(momentum)
    return w


@register_method("fedap")
class FedAP(FedBN):
    """FedBN during ``warmup_rounds``; then every site reports the BN-input statistics of
    the warmed-up model once, the server fixes ``W`` from their similarity
    (:func:`fedap_weights`) and sends site ``i`` the mixture ``sum_j W[i, j] theta_j`` of the
    non-BN weights. BN parameters and statistics stay local throughout.

    Reference: Lu et al., "Personalized Federated Learning with Adaptive Batchnorm for
    Healthcare", IEEE Transactions on Big Data, 2022.
    """

    class Config(MethodConfig):
        """FedAP settings."""

        warmup_rounds: int = Field(5, ge=0)
        """FedBN rounds before the statistics are collected (replaces FedAP's pre-training)."""
        momentum: float = Field(0.5, ge=0, le=1)
        """A site's weight on its own model, the diagonal of ``W`` (FedAP's model_momentum)."""
        stat_batches: int | None = Field(None, ge=1)
        """Batches for the statistics (default: one pass over the site's training set)."""

    config: Config
    summary = "FedAP: BN local; per-site mixture of models weighted by BN-statistics similarity"

    # -- client ----------------------------------------------------------------------------
    def upload_template(self, model: nn.Module) -> Template:
        out = super().upload_template(model)
        for name, m in model.named_modules():
            if isinstance(m, BN_TYPES):
                for part in ("mean", "var"):
                    out[f"{STAT}{name}.{part}"] = TensorSpec((m.num_features,), torch.float32)
        return out

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model = ctx.model
        self.load(model, payload, state)
        asked = payload.metrics.get(REQUEST, 0.0) > 0
        stats: BNStats = {}
        if asked:  # on the received (warmed-up) model, before this round's training
            per_pass = ctx.site.num_train // min(ctx.train.batch_size, ctx.site.num_train)
            stats = bn_input_stats(model, ctx.batches, self.config.stat_batches or per_pass)
        metrics = self.train_round(payload, ctx)
        tensors, private = self.split(model)
        for name, m in model.named_modules():  # the slots travel every round, zero unless asked
            if isinstance(m, BN_TYPES):
                mean, var = stats.get(name, (torch.zeros(m.num_features),) * 2)
                tensors[f"{STAT}{name}.mean"] = mean.cpu()
                tensors[f"{STAT}{name}.var"] = var.cpu()
        upload = Payload(tensors, {REQUEST: 1.0} if asked else {}, ctx.site.num_train)
        return ClientResult(upload, private, metrics)

    # -- server ----------------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        out = super().init_server(model)
        if self.config.warmup_rounds == 0:
            for p in out.payloads.values():
                p.metrics[REQUEST] = 1.0
        return ServerResult(out.payloads, {"stats": {}})

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        names = ctx.spec.site_names
        if ctx.round == 0 and self.config.warmup_rounds >= ctx.train.rounds:
            log.warning("fedap: warmup_rounds >= rounds, so FedAP never leaves FedBN")
        shared = [k for k in next(iter(uploads.values())).tensors if not k.startswith(STAT)]
        state = {**state, "stats": dict(state.get("stats", {}))}
        metrics: dict[str, object] = {}
        if "W" not in state:
            for site, up in uploads.items():
                if up.metrics.get(REQUEST, 0.0) > 0:
                    state["stats"][site] = _unpack(up.tensors)
            if all(n in state["stats"] for n in names):
                w = fedap_weights([state["stats"][n] for n in names], self.config.momentum)
                state = {"W": w.tolist()}
                metrics["fedap_W"] = state["W"]
        if "W" not in state:
            glob = weighted_average(uploads, keys=shared)
            ask = {REQUEST: 1.0} if ctx.round + 1 >= self.config.warmup_rounds else {}
            payloads = {n: Payload(glob, dict(ask)) for n in names}
            return ServerResult(payloads, state, metrics)
        w = torch.tensor(state["W"], dtype=torch.float64)
        senders = [n for n in names if n in uploads]
        cols = [names.index(n) for n in senders]
        rows = w[:, cols]
        empty = rows.sum(1) <= 0  # a site whose weights are all on sites that did not send
        rows[empty] = 1.0
        mixed = mix_states([uploads[n].tensors for n in senders], rows, shared)
        payloads = {name: Payload(m) for name, m in zip(names, mixed, strict=True)}
        return ServerResult(payloads, state, metrics)


def _unpack(tensors: Mapping[str, torch.Tensor]) -> BNStats:
    """The statistics carried by an upload, in the model's layer order."""
    means = [
        k[len(STAT) : -len(".mean")] for k in tensors if k.startswith(STAT) and k.endswith(".mean")
    ]
    return {
        layer: (tensors[f"{STAT}{layer}.mean"], tensors[f"{STAT}{layer}.var"]) for layer in means
    }
