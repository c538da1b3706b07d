"""HarmoFL (Jiang, Wang & Dou, AAAI 2022) as a baseline of FedBCS's Table 1: amplitude
normalisation of the input images toward a shared amplitude spectrum (local drift) and a
weight-perturbation step toward flat local optima (global drift).

The shared spectrum is a buffer of the network (``amp_norm.running_amp``, ``[C, *S]``): sites
accumulate their images' mean amplitude while ``round < amp_rounds``, the server averages it
with the weights, and from then on it is fixed. It is a statistic of the sites' data: it is
uploaded every round like every shared tensor, counted in the communication, and the privacy
table lists it among the uploaded non-BN buffers. See docs/methods/harmofl.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.clustered_prototypes import Weighting, aggregation_weights
from fedseg.methods.registry import register_method
from fedseg.methods.training import (
    add_auxiliary,
    autocast,
    auxiliary_metrics,
    auxiliary_modules,
    channels_last_model,
    clamp_gradients,
    current_precision,
    make_optimizer,
    memory_format,
    restore_optimizer_state,
    save_optimizer_state,
    segmentation_loss,
)

__all__ = [
    "AmpNorm",
    "AmpNormNet",
    "HarmoFL",
    "low_frequency_mask",
    "normalize_amplitude",
    "perturbed_step",
]


def low_frequency_mask(size: tuple[int, ...], ratio: float) -> torch.Tensor:
    """Boolean mask over an unshifted FFT grid of ``size``: frequencies with ``|k| <=
    floor(min(size) * ratio)`` along every axis (``ratio = 0``: the zero frequency only, as
    HarmoFL's code, ``L = 0``)."""
    b = math.floor(min(size) * ratio)
    axes = [torch.fft.fftfreq(n, d=1.0 / n).round().abs() <= b for n in size]
    mask = axes[0]
    for a in axes[1:]:
        mask = mask[..., None] & a
    return mask


def normalize_amplitude(x: torch.Tensor, amplitude: torch.Tensor, ratio: float) -> torch.Tensor:
    """Images ``x`` ``[B, C, *S]`` whose Fourier amplitude inside the low-frequency window
    (:func:`low_frequency_mask`) is replaced by ``amplitude`` ``[C, *S]``; every phase and the
    amplitude outside the window are kept."""
    dims = tuple(range(2, x.dim()))
    spectrum = torch.fft.fftn(x.double(), dim=dims)
    amp, phase = spectrum.abs(), spectrum.angle()
    mask = low_frequency_mask(tuple(x.shape[2:]), ratio).to(x.device)
    amp = torch.where(mask, amplitude.to(amp), amp)
    return torch.fft.ifftn(torch.polar(amp, phase), dim=dims).real.to(x.dtype)


class AmpNorm(nn.Module):
    """HarmoFL's amplitude normalisation layer, placed before the network.

    ``running_amp`` is the shared amplitude spectrum; while ``collect`` is set (and in training
    mode) every batch updates it with its mean amplitude (the first batch sets it, later ones
    by an exponential moving average with ``momentum``). An all-zero spectrum (nothing
    collected yet) leaves images unchanged.
    """

    def __init__(
        self, channels: int, size: tuple[int, ...], momentum: float = 0.1, ratio: float = 0.0
    ) -> None:
        super().__init__()
        self.register_buffer("running_amp", torch.zeros(channels, *size))
        self.momentum, self.ratio = momentum, ratio
        self.collect = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[1:]) != tuple(self.running_amp.shape):
            raise ConfigError(
                f"harmofl's amplitude normalisation holds a spectrum of shape "
                f"{list(self.running_amp.shape)} (channels and the federation's image size); "
                f"got images of shape {list(x.shape[1:])}"
            )
        if self.training and self.collect:
            self.update(x)
        if not bool(self.running_amp.any()):
            return x
        return normalize_amplitude(x, self.running_amp, self.ratio)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold the mean amplitude of batch ``x`` into ``running_amp``."""
        amp = torch.fft.fftn(x.double(), dim=tuple(range(2, x.dim()))).abs().mean(0)
        if not bool(self.running_amp.any()):
            self.running_amp.copy_(amp)
        else:
            self.running_amp.mul_(1 - self.momentum).add_(self.momentum * amp.float())


class AmpNormNet(nn.Module):
    """``net(amp_norm(x))``: a network behind HarmoFL's amplitude normalisation."""

    def __init__(self, amp_norm: AmpNorm, net: nn.Module) -> None:
        super().__init__()
        self.amp_norm, self.net = amp_norm, net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.amp_norm(x))


def perturbed_step(
    optimizer: torch.optim.Optimizer,
    loss_of: Callable[[], torch.Tensor],
    alpha: float,
    clamp: float | None = None,
) -> float:
    """One HarmoFL optimiser step (its ``WPOptim``): the gradient ``g`` at ``w``, the
    perturbation ``delta = alpha * g / ||g||`` (norm over all parameters), the gradient at
    ``w + delta``, then ``w`` restored and the base optimiser's step taken with that gradient.
    ``alpha = 0`` is a plain step; ``clamp`` clamps the gradient taken (``train.grad_clamp``).
    Returns the loss at ``w``."""
    loss = loss_of()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if alpha > 0:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)  # type: ignore[union-attr]
        with torch.no_grad():
            deltas = [p.grad * (alpha / (norm + 1e-12)) for p in params]  # type: ignore[operator]
            for p, d in zip(params, deltas, strict=True):
                p.add_(d)
        optimizer.zero_grad(set_to_none=True)
        loss_of().backward()
        with torch.no_grad():
            for p, d in zip(params, deltas, strict=True):
                p.sub_(d)
    clamp_gradients(optimizer, clamp)
    optimizer.step()
    return float(loss.detach())


@register_method("harmofl")
class HarmoFL(Method):
    """FedAvg of every weight and of the shared amplitude spectrum; local training runs on
    amplitude-normalised images with weight-perturbed (flatness-seeking) steps.

    Reference: Jiang, Wang & Dou, "HarmoFL: Harmonizing Local and Global Drifts in Federated
    Learning on Heterogeneous Medical Images", AAAI 2022.
    """

    class Config(MethodConfig):
        """HarmoFL settings (code defaults: alpha 0.05, DC-only normalisation, one round)."""

        alpha: float = Field(0.05, ge=0)
        """Weight-perturbation radius (0: plain optimiser steps)."""
        amp_norm: bool = True
        """Amplitude normalisation of the inputs (false: weight perturbation only)."""
        amp_momentum: float = Field(0.1, ge=0, le=1)
        """Moving-average momentum of the running amplitude (0: the first batch's mean
        amplitude only, what HarmoFL's released Cython code effectively does)."""
        amp_rounds: PositiveInt = 1
        """Rounds in which sites update the spectrum before it is fixed (code: 1)."""
        low_freq_ratio: float = Field(0.0, ge=0, le=0.5)
        """Half-width of the replaced low-frequency window as a fraction of the image size
        (code: 0, the zero frequency only)."""
        weighting: Weighting = "samples"
        """Model averaging: ``samples`` (FedBCS's protocol) or ``uniform`` (HarmoFL's code)."""

    config: Config
    summary = (
        "HarmoFL: FedAvg + input amplitude normalisation toward a shared spectrum (a data "
        "statistic, uploaded) + weight-perturbation steps"
    )

    def build_model(self) -> nn.Module:
        net = super().build_model()
        cfg, s = self.config, self.spec
        if not cfg.amp_norm:
            return net
        if len(s.image_size) != s.ndim:
            raise ConfigError(
                "method.amp_norm needs the federation's image size (all images of one size); "
                f"the federation gives {list(s.image_size)}"
            )
        amp = AmpNorm(s.in_channels, tuple(s.image_size), cfg.amp_momentum, cfg.low_freq_ratio)
        return AmpNormNet(amp, net)

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        self.load(ctx.model, payload, state)
        metrics = self.train_round(ctx)
        upload, private = self.split(ctx.model)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def train_round(self, ctx: ClientContext) -> dict[str, float]:
        """Local steps on normalised images (the spectrum updated once per batch while
        ``round < amp_rounds``) with :func:`perturbed_step`; the network's forwards run under
        the engine's precision (``bf16`` autocast, channels-last), the amplitude
        normalisation in float32."""
        if current_precision().amp == "fp16":
            raise ConfigError(
                "engine.amp: 'fp16' is not supported by harmofl: its weight-perturbed step "
                "takes two gradients per step, which CUDA's fp16 gradient scaler cannot "
                "unscale; use 'bf16' or 'off'"
            )
        model = ctx.model
        amp = model.amp_norm if isinstance(model, AmpNormNet) else None
        net = model.net if isinstance(model, AmpNormNet) else model
        loss_fn, aux = segmentation_loss(ctx), auxiliary_modules(net)
        opt = make_optimizer([p for p in net.parameters() if p.requires_grad], ctx)
        restore_optimizer_state(opt, net, ctx)
        model.train()
        if amp is not None:
            amp.collect = ctx.round < self.config.amp_rounds
        n, total = ctx.steps(), 0.0
        with channels_last_model(net):
            for _ in range(n):
                images, labels = next(ctx.batches)
                x = memory_format(images if amp is None else amp(images))

                def loss_of(x: torch.Tensor = x, y: torch.Tensor = labels) -> torch.Tensor:
                    with autocast(ctx.device):
                        return add_auxiliary(loss_fn(net(x), y), aux)

                total += perturbed_step(opt, loss_of, self.config.alpha, ctx.train.grad_clamp)
        if amp is not None:
            amp.collect = False
        save_optimizer_state(opt, net, ctx)
        return {"loss": total / max(n, 1)} | auxiliary_metrics(aux)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        weights = aggregation_weights(uploads, self.config.weighting)
        payload = Payload(weighted_average(uploads, weights))
        return ServerResult(dict.fromkeys(ctx.spec.site_names, payload), state)
