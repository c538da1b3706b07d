"""Local differential privacy of each site's examples: DP-SGD (Abadi et al. 2016) inside the
shared training loop.

:class:`LocalDP` wraps the configured method and runs its client step within
:func:`~fedseg.methods.training.step_loop` of a :class:`DPSGD`, so every
:func:`~fedseg.methods.training.train_steps` call of the method takes DP-SGD steps. One step:

1. a Poisson sample of the site's ``n`` training examples, each with probability
   ``q = min(1, batch_size / n)`` (from the client step's seeded generator);
2. each sampled example's gradient from a forward and backward pass of that example alone,
   so its loss (pCE over its own labelled pixels, its own Dice, ...) never mixes examples;
3. each gradient clipped to ``clip`` in L2 over every optimised parameter, the clipped
   gradients summed, Gaussian noise of standard deviation ``noise_multiplier * clip`` added,
   and the sum divided by the expected batch size ``batch_size``;
4. a data-independent regulariser's gradient (FedProx's proximal term) added unclipped, then
   the configured optimiser's step.

Every engine builds the same wrapper, so in-process and Flower runs are identical. The
site's steps so far live in its private state; its epsilon (dp-accounting, Poisson-sampled
Gaussian) joins the round's client metrics in ``rounds.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedseg.data.transforms import augment
from fedseg.errors import ConfigError
from fedseg.methods import Method
from fedseg.methods.base import (
    Aggregator,
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.fedbabu import FedBABU
from fedseg.methods.fedprox import FedProx
from fedseg.methods.fedrep import FedRep
from fedseg.methods.ft import FineTune
from fedseg.methods.local import LocalOnly
from fedseg.methods.training import (
    LossFn,
    add_auxiliary,
    autocast,
    auxiliary_modules,
    memory_format,
    step_loop,
)
from fedseg.privacy.accountant import sgd_epsilon, steps_within_budget
from fedseg.privacy.settings import PrivacySettings
from fedseg.privacy.wrapper import PrivateWrapper

__all__ = [
    "DPSGD",
    "LocalDP",
    "batch_norms",
    "clip_into",
    "require_local_dp",
    "supported_local_methods",
    "supports_local_dp",
]

STEPS = "dp_steps"
"""Private-state key of the DP-SGD steps a site has taken so far."""

SUPPORTED: tuple[type[Method], ...] = (FedAvg, FedProx, FineTune, FedRep, FedBABU, LocalOnly)
"""Methods whose client step trains only through ``train_steps`` with a loss of the
network's output and the labels (plus a data-independent regulariser) and uploads only
weights; subclasses are not assumed to keep that."""

WHY = {
    "fedala": "its ALA step learns aggregation weights on the site's batches outside "
    "train_steps, with no per-example clipping or noise",
    "fedavg_aaw": "its aggregation weights come from each site's validation loss, sent "
    "without noise",
    "fedprox_aaw": "its aggregation weights come from each site's validation loss, sent "
    "without noise",
    "centralized": "it pools every site's data on one machine",
    "fedbn": "its private parts are the BatchNorm layers, whose batch statistics mix "
    "examples (with model.norm group or instance it keeps nothing private: use fedavg)",
}
"""Why a method is refused, where the general reason is not specific enough."""


def supports_local_dp(cls: type[Method]) -> bool:
    """True for a method whose whole client step DP-SGD covers (an exact class listed)."""
    return cls in SUPPORTED


def supported_local_methods() -> list[str]:
    """Registered methods that ``privacy.mode: local`` accepts."""
    from fedseg.methods import get_method, list_methods

    return [n for n in list_methods("*") if supports_local_dp(get_method(n))]


def require_local_dp(name: str, cls: type[Method]) -> None:
    """ConfigError saying why method ``name`` cannot run under ``privacy.mode: local``."""
    if supports_local_dp(cls):
        return
    why = WHY.get(
        name,
        "its client step computes on the site's data outside the per-example DP-SGD steps "
        "(its own training loop, losses over several examples such as contrastive or "
        "prototype terms, or statistics and prototypes it uploads)",
    )
    raise ConfigError(
        f"privacy.mode local: method {name!r} is not supported: {why}; supported: "
        + ", ".join(supported_local_methods())
    )


def batch_norms(model: nn.Module) -> list[str]:
    """Names of ``model``'s BatchNorm layers."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class LocalDP(PrivateWrapper):
    """``inner`` with every local training step replaced by a DP-SGD step."""

    def __init__(self, inner: Method, settings: PrivacySettings, name: str) -> None:
        require_local_dp(name, type(inner))
        if norms := batch_norms(inner.build_model()):
            raise ConfigError(
                f"privacy.mode local: the network has BatchNorm layers ({norms[0]}, ...), whose "
                "batch statistics mix examples and whose running statistics leave the site "
                "without noise; set model.norm: group or instance"
            )
        super().__init__(inner, settings, name, "local DP-SGD")

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        """The method's client step with DP-SGD steps; the site's epsilon after them joins
        its metrics (with the steps so far and the sampling rate)."""
        sgd = DPSGD(self.settings, ctx, state.get(STEPS, 0))
        with step_loop(sgd):
            res = self.inner.client_step(payload, state, ctx)
        metrics = {
            **res.metrics,
            "dp_epsilon": sgd_epsilon(self.settings, sgd.rate, sgd.steps),
            "dp_delta": self.settings.delta,
            "dp_steps": float(sgd.steps),
            "dp_sampling_rate": sgd.rate,
        }
        return ClientResult(res.upload, {**res.state, STEPS: sgd.steps}, metrics)

    def init_server(self, model: nn.Module) -> ServerResult:
        return self.inner.init_server(model)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        return self.inner.server_step(uploads, state, ctx)

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        return self.inner.aggregator(state, ctx)


class DPSGD:
    """A :class:`~fedseg.methods.training.StepLoop` of DP-SGD steps on one site's data for
    one client step; ``steps`` counts the site's steps, those of earlier rounds included."""

    def __init__(self, settings: PrivacySettings, ctx: ClientContext, steps: int) -> None:
        self.settings, self.ctx, self.steps = settings, ctx, steps
        self.batch = ctx.train.batch_size
        self.rate = min(1.0, self.batch / ctx.site.num_train)
        self.budget = steps_within_budget(settings, self.rate)
        self.data: tuple[torch.Tensor, torch.Tensor] | None = None

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A Poisson sample of the site's training examples (augmented if configured)."""
        ctx = self.ctx
        if self.data is None:
            self.data = next(ctx.ordered_batches(ctx.site.num_train))
        images, labels = self.data
        pick = (torch.rand(len(images), generator=ctx.generator) < self.rate).to(images.device)
        x, y = images[pick], labels[pick]
        if ctx.train.augment and len(x):
            x, y = augment(
                x.cpu(),
                y.cpu(),
                ctx.generator,
                rotation=ctx.train.rotation,
                ignore_index=ctx.spec.ignore_index,
            )
        return x.to(ctx.device), y.to(ctx.device)

    def __call__(
        self,
        model: nn.Module,
        ctx: ClientContext,
        opt: torch.optim.Optimizer,
        loss_fn: LossFn,
        iters: int,
        regularizer: Callable[[], torch.Tensor] | None,
    ) -> dict[str, float]:
        params = [p for group in opt.param_groups for p in group["params"]]
        aux = auxiliary_modules(model)
        total, count = 0.0, 0
        for _ in range(iters):
            if self.budget is not None and self.steps >= self.budget:
                break
            images, labels = self.sample()
            summed = [torch.zeros_like(p) for p in params]
            for i in range(len(images)):
                with autocast(ctx.device):
                    out = model(memory_format(images[i : i + 1]))
                    loss = add_auxiliary(loss_fn(out, labels[i : i + 1]), aux)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                clip_into(summed, grads, self.settings.clip)
                total, count = total + float(loss.detach()), count + 1
            opt.zero_grad(set_to_none=True)
            std = self.settings.noise_multiplier * self.settings.clip
            for p, s in zip(params, summed, strict=True):
                noise = torch.randn(s.shape, generator=ctx.generator, dtype=s.dtype)
                p.grad = (s + std * noise.to(s.device)) / self.batch
            if regularizer is not None:
                regularizer().backward()
            opt.step()
            self.steps += 1
        return {"loss": total / max(count, 1)}


def clip_into(
    summed: list[torch.Tensor], grads: tuple[torch.Tensor | None, ...], clip: float
) -> None:
    """Add ``grads`` (one example's; None for an unused parameter) to ``summed``, scaled by
    ``min(1, clip / norm)`` with the L2 norm over all of them."""
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))
    scale = min(1.0, clip / max(norm, 1e-12))
    for s, g in zip(summed, grads, strict=True):
        if g is not None:
            s.add_(g, alpha=scale)
