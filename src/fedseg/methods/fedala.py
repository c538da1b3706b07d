"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the global model."""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.ala import LAResult, init_weights, train_weights_by_pass
from fedseg.methods.base import ClientContext, ClientResult, Payload, SiteSpec, State
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.partition import Partition
from fedseg.methods.registry import register_method
from fedseg.methods.wss import WSSConfig

__all__ = ["FedALA", "ala_keys"]

AUX = "aux_decoder."


def buffers(model: nn.Module) -> list[str]:
    """Partition selector: every buffer (BN running statistics and batch counters)."""
    return [name for name, _ in model.named_buffers()]


def ala_keys(model: nn.Module, layers: int) -> list[str]:
    """FedALA's "higher layers": the last ``layers`` parameter tensors of the UNet (and, with
    an auxiliary decoder, the last ``layers`` of that decoder too), in registration order."""
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    groups = [[k for k in names if not k.startswith(AUX)], [k for k in names if k.startswith(AUX)]]
    if layers > len(groups[0]):
        raise ConfigError(f"method.ala_layers must be <= {len(groups[0])}, got {layers}")
    return [k for group in groups if group for k in group[-layers:]]


@register_method("fedala")
class FedALA(FedAvg):
    """Each site starts a round from ``theta_i + (theta_g - theta_i) * W`` on its higher
    layers (global weights below), with element-wise ``W`` in [0, 1] learned on a random
    fraction of its data and kept across rounds; then it trains as in FedAvg. The server
    averages parameters by sample count; BN statistics stay local, as in FedALA's code.

    Reference: Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
    Learning", AAAI 2023.
    """

    class Config(WSSConfig):
        """FedALA settings (plus the ``wss`` option)."""

        ala_layers: int = Field(2, ge=1)
        """Parameter tensors (counted from the end) that ALA adapts; 2 = the head's weight
        and bias (FedALA's layer_idx)."""
        eta: float = Field(1.0, gt=0)
        """Learning rate of the aggregation weights."""
        rand_percent: float = Field(0.8, gt=0, le=1)
        """Fraction of the local training set one ALA pass sees."""
        threshold: float = Field(0.1, gt=0)
        """First ALA call: pass until the std of the last ``num_pre_loss`` losses is below."""
        num_pre_loss: int = Field(10, ge=1)
        """Window of pass losses for the first call's convergence test."""
        max_start_passes: int = Field(50, ge=1)
        """Cap on the first call's passes (FedALA has none and can hang)."""

    config: Config
    partition = Partition(private=(buffers,))
    personalized = True
    summary = "FedALA: adaptive local aggregation (element-wise weights) on the top layers"

    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        state = super().init_client(model, site)
        keys = ala_keys(model, self.config.ala_layers)
        sd = model.state_dict()
        state["ala_prev"] = {k: sd[k].detach().clone() for k in keys}
        state["ala"] = init_weights(sd, keys)
        state["ala_started"] = False
        return state

    def _adapt(self, payload: Payload, state: State, ctx: ClientContext) -> LAResult:
        """Load the ALA-initialised local model into ``ctx.model`` (trains ``W``)."""
        self.load(ctx.model, payload, state)
        cfg, site = self.config, ctx.site
        size = min(ctx.train.batch_size, site.num_train)
        per_pass = max(
            1, min(site.num_train // size, math.ceil(cfg.rand_percent * site.num_train / size))
        )
        net, loss = self.training_pair(ctx.model, ctx)
        first = not state["ala_started"]
        return train_weights_by_pass(
            ctx.model,
            state["ala_prev"],
            payload.tensors,
            state["ala"],
            ctx.batches,
            lambda _, x, y: loss(net(x), y),
            per_pass=per_pass,
            first=first,
            max_passes=cfg.max_start_passes,
            eta=cfg.eta,
            window=cfg.num_pre_loss,
            tol=cfg.threshold,
        )

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        ala = self._adapt(payload, state, ctx)
        metrics = self.local_train(ctx.model, ctx)
        metrics.update(ala_steps=float(ala.steps), ala_w_mean=_mean(ala.weights))
        upload, private = self.split(ctx.model)
        sd = ctx.model.state_dict()
        private.update(
            ala_prev={k: sd[k].detach().clone() for k in state["ala_prev"]},
            ala=ala.weights,
            ala_started=state["ala_started"] or not ala.skipped,
        )
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The site's ALA-initialised model for the latest global model (FedALA evaluates
        right after local initialisation); the learned ``W`` is not stored."""
        self._adapt(payload, state, ctx)
        return ctx.model


def _mean(weights: dict[str, torch.Tensor]) -> float:
    total = sum(float(w.sum()) for w in weights.values())
    return total / max(sum(w.numel() for w in weights.values()), 1)
