"""Local differential privacy of each site's examples: DP-SGD (Abadi et al. 2016) inside the
shared training loop.

:class:`LocalDP` wraps the configured method and runs its client step within
:func:`~fedseg.methods.training.step_loop` of a :class:`DPSGD`, so every
:func:`~fedseg.methods.training.train_steps` call of the method takes DP-SGD steps. One step:

1. a Poisson sample of the site's ``n`` training examples, each with probability
   ``q = min(1, batch_size / n)`` (from the client step's seeded generator);
2. each sampled example's gradient from one batched forward and backward pass through
   Opacus's :class:`~opacus.GradSampleModule` (per-sample gradients from layer hooks, or
   functorch for a layer without a hook), the loss being the sum of each example's own loss
   (pCE over its own labelled pixels, its own Dice, ...), so no term mixes examples;
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

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedseg.data.transforms import augment
from fedseg.errors import ConfigError
from fedseg.methods import Method
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Payload,
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
    "clipped_sum",
    "require_local_dp",
    "require_per_example",
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


def _opacus() -> Any:
    try:
        import opacus
        import opacus.validators
    except ImportError:
        raise ConfigError(
            "privacy.mode local: per-example gradients need opacus (pip install 'fedseg[privacy]')"
        ) from None
    return opacus


def require_per_example(model: nn.Module) -> None:
    """ConfigError unless every layer of ``model`` treats the examples of a batch apart
    (Opacus's ModuleValidator) and no module adds a loss term of the whole batch."""
    if norms := batch_norms(model):
        raise ConfigError(
            f"privacy.mode local: the network has BatchNorm layers ({norms[0]}, ...), whose "
            "batch statistics mix examples and whose running statistics leave the site "
            "without noise; set model.norm: group or instance"
        )
    if errors := _opacus().validators.ModuleValidator.validate(model, strict=False):
        raise ConfigError(f"privacy.mode local: Opacus refuses the network: {errors[0]}")
    if aux := auxiliary_modules(model):
        raise ConfigError(
            f"privacy.mode local: the network's {type(aux[0]).__name__} adds a loss term of "
            "the whole batch, which per-example clipping does not cover"
        )


class LocalDP(PrivateWrapper):
    """``inner`` with every local training step replaced by a DP-SGD step."""

    def __init__(self, inner: Method, settings: PrivacySettings, name: str) -> None:
        require_local_dp(name, type(inner))
        require_per_example(inner.build_model())
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
        params = [p for group in opt.param_groups for p in group["params"] if p.requires_grad]
        std = self.settings.noise_multiplier * self.settings.clip
        total, count = 0.0, 0
        net = _opacus().GradSampleModule(model, loss_reduction="sum")
        try:
            for _ in range(iters):
                if self.budget is not None and self.steps >= self.budget:
                    break
                summed, losses = self.clipped_gradients(net, params, loss_fn)
                total, count = total + sum(losses), count + len(losses)
                opt.zero_grad(set_to_none=True)
                for p, s in zip(params, summed, strict=True):
                    noise = torch.randn(s.shape, generator=ctx.generator, dtype=s.dtype)
                    p.grad = (s + std * noise.to(s.device)) / self.batch
                if regularizer is not None:
                    regularizer().backward()
                opt.step()
                self.steps += 1
        finally:
            net._close()
        return {"loss": total / max(count, 1)}

    def clipped_gradients(
        self, net: nn.Module, params: list[nn.Parameter], loss_fn: LossFn
    ) -> tuple[list[torch.Tensor], list[float]]:
        """The sum over a Poisson sample of the examples' clipped gradients (zeros for an
        empty sample), and each example's loss; ``net`` is a GradSampleModule."""
        images, labels = self.sample()
        summed = [torch.zeros_like(p) for p in params]
        if not len(images):
            return summed, []
        with autocast(self.ctx.device):
            out = net(memory_format(images))
            losses = [loss_fn(out[i : i + 1], labels[i : i + 1]) for i in range(len(out))]
        with warnings.catch_warnings():  # the images need no gradient
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            torch.autograd.grad(torch.stack(losses).sum(), params, allow_unused=True)
        clipped_sum(summed, [getattr(p, "grad_sample", None) for p in params], self.settings.clip)
        net.set_grad_sample_to_none()  # type: ignore[operator]
        return summed, [float(v.detach()) for v in losses]


def clipped_sum(
    summed: list[torch.Tensor], samples: Sequence[torch.Tensor | None], clip: float
) -> None:
    """Add to ``summed`` the per-example gradients ``samples`` (one tensor per parameter, the
    examples along dim 0; None for an unused parameter), each example's gradient scaled by
    ``min(1, clip / norm)`` with its L2 norm over all parameters (in float64)."""
    present = [g for g in samples if g is not None]
    if not present:
        return
    norms = sum(g.double().flatten(1).square().sum(1) for g in present).sqrt()
    scale = (clip / norms.clamp(min=1e-12)).clamp(max=1.0)
    for s, g in zip(summed, samples, strict=True):
        if g is not None:
            s.add_(torch.einsum("b,b...->...", scale.to(g.dtype), g))
