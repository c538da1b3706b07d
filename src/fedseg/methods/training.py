"""Local-training building blocks shared by methods: optimiser, loss, a step loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.losses import DiceBCELoss, PartialCrossEntropy, SoftDiceLoss
from fedseg.methods.base import ClientContext
from fedseg.models import ModelConfig

__all__ = [
    "Amp",
    "AuxiliaryLoss",
    "LossFn",
    "Precision",
    "StepLoop",
    "add_auxiliary",
    "autocast",
    "auxiliary_metrics",
    "auxiliary_modules",
    "backward_step",
    "channels_last_model",
    "clamp_gradients",
    "cpu_flags",
    "current_precision",
    "grad_scaler",
    "make_optimizer",
    "memory_format",
    "native_bf16",
    "precision",
    "restore_optimizer_state",
    "save_optimizer_state",
    "segmentation_loss",
    "step_loop",
    "train_steps",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


Amp = Literal["off", "auto", "bf16", "fp16"]
"""``engine.amp``: ``auto`` is bf16 where the device computes it natively and the network
and method were shown to train alike in it (docs/benchmarks_speed.md), else off."""


@dataclass(frozen=True)
class Precision:
    """How forwards run: ``amp`` autocast dtype and channels-last memory format
    (``engine.amp`` and ``engine.channels_last``; ``auto`` values until :meth:`resolve`)."""

    amp: Amp = "off"
    channels_last: bool | Literal["auto"] = False

    def resolve(
        self, model: ModelConfig, ndim: int, device: torch.device, method_bf16: bool = True
    ) -> Precision:
        """The concrete precision for ``model`` (``ndim``-D) on ``device``: ``amp: auto`` is
        ``bf16`` where :func:`native_bf16` and where bf16 was shown not to move results,
        for the network (:meth:`~fedseg.models.ModelConfig.bf16_auto`) and the method
        (``method_bf16``, :attr:`fedseg.methods.Method.bf16_auto`), else ``off``;
        ``channels_last: auto`` is the network's
        :meth:`~fedseg.models.ModelConfig.channels_last_faster`."""
        amp = self.amp
        if amp == "auto":
            chosen = native_bf16(device) and model.bf16_auto(ndim) and method_bf16
            amp = "bf16" if chosen else "off"
        cl = self.channels_last
        if cl == "auto":
            cl = model.channels_last_faster(ndim)
        no_amx = device.type == "cpu" and "amx_bf16" not in cpu_flags()
        if amp == "bf16" and cl and ndim == 3 and no_amx:
            raise ConfigError(
                "engine.channels_last: true with bf16 on a 3D network is refused on a CPU "
                "without AMX: it turned the 3D UNet's weights non-finite on such a CPU "
                "(docs/config.md#bf16-and-channels-last-in-3d); use channels_last: auto"
            )
        return Precision(amp, bool(cl))


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(
        flag
        for line in text.splitlines()
        if line.startswith("flags")
        for flag in line.split(":", 1)[1].split()
    )


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CPU with ``avx512_bf16`` or
    ``amx_bf16`` (read at run time), a CUDA device that supports bf16."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
    return False


_PRECISION: ContextVar[Precision | None] = ContextVar("fedseg_precision", default=None)


@contextmanager
def precision(
    amp: Literal["off", "bf16", "fp16"] = "off", channels_last: bool = False
) -> Iterator[Precision]:
    """Within this block :func:`train_steps` and :func:`fedseg.evaluation.predict` run with
    this precision; the engine enters it from ``engine.amp``/``engine.channels_last``
    (``auto`` values resolved by :meth:`Precision.resolve`)."""
    if amp not in ("off", "bf16", "fp16"):
        raise ConfigError(f"engine.amp must be one of off, bf16, fp16 here, got {amp!r}")
    if not isinstance(channels_last, bool):
        raise ConfigError(f"engine.channels_last must be true or false here, got {channels_last!r}")
    token = _PRECISION.set(Precision(amp, channels_last))
    try:
        yield current_precision()
    finally:
        _PRECISION.reset(token)


def current_precision() -> Precision:
    """The precision set by the innermost :func:`precision` block (default: fp32)."""
    return _PRECISION.get() or Precision()


def autocast(device: torch.device) -> AbstractContextManager[object]:
    """The current precision's autocast on ``device`` (a no-op for ``amp: off``).

    Raises
    ------
    ConfigError
        For ``fp16`` off CUDA (it needs CUDA's gradient scaler; use ``bf16`` there).
    """
    amp = current_precision().amp
    if amp == "off":
        return nullcontext()
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(
            f"engine.amp: 'fp16' needs a CUDA device, got {device.type!r}; use 'bf16' or 'off'"
        )
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def memory_format(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a 4D/5D batch) in channels-last format when the current precision asks."""
    if not current_precision().channels_last or x.dim() not in (4, 5):
        return x
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return x.contiguous(memory_format=fmt)


_CONVS = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)


@contextmanager
def channels_last_model(model: nn.Module) -> Iterator[nn.Module]:
    """``model``'s convolution weights in channels-last (3D: channels-last-3d) format while
    the current precision asks, back to the contiguous format afterwards (payloads and
    checkpoints keep plain layouts). Other parameters (e.g. IOP-FL's expert kernels, mixed
    per sample) keep their layout."""
    weights = [m.weight for m in model.modules() if isinstance(m, _CONVS)]
    if not current_precision().channels_last or not weights:
        yield model
        return
    for w in weights:
        fmt = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
        w.data = w.data.contiguous(memory_format=fmt)
    try:
        yield model
    finally:
        for w in weights:
            w.data = w.data.contiguous()


def grad_scaler(device: torch.device) -> torch.amp.GradScaler | None:
    """CUDA's gradient scaler when the current precision is ``fp16`` (None otherwise)."""
    fp16 = current_precision().amp == "fp16" and device.type == "cuda"
    return torch.amp.GradScaler("cuda") if fp16 else None


def backward_step(
    opt: torch.optim.Optimizer,
    loss: torch.Tensor,
    scaler: torch.amp.GradScaler | None,
    clamp: float | None = None,
) -> None:
    """Zero the gradients, back-propagate ``loss``, clamp every gradient element to
    ``[-clamp, clamp]`` (unscaled first; ``None``: no clamp) and step ``opt`` (through
    ``scaler``)."""
    opt.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        clamp_gradients(opt, clamp)
        opt.step()
    else:
        scaler.scale(loss).backward()
        if clamp is not None:
            scaler.unscale_(opt)
            clamp_gradients(opt, clamp)
        scaler.step(opt)
        scaler.update()


def clamp_gradients(opt: torch.optim.Optimizer, clamp: float | None) -> None:
    """Clamp the gradient of every parameter of ``opt`` element-wise to ``[-clamp, clamp]``
    (``train.grad_clamp``; ``None``: unchanged)."""
    if clamp is not None:
        params = [p for group in opt.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_value_(params, clamp)


@runtime_checkable
class AuxiliaryLoss(Protocol):
    """A sub-module with a loss term of its own (e.g. SynergyNet's vector quantiser):
    :func:`train_steps` adds it to every method's loss and reports its metrics."""

    def pop_auxiliary_loss(self) -> torch.Tensor | None:
        """The term of the last forward pass (None: none since the last call)."""

    def auxiliary_metrics(self) -> dict[str, float]:
        """Statistics of the forwards whose term was popped since the last call (then reset)."""


def auxiliary_modules(model: nn.Module) -> list[AuxiliaryLoss]:
    """The :class:`AuxiliaryLoss` sub-modules of ``model`` (none for the UNet)."""
    return [m for m in model.modules() if isinstance(m, AuxiliaryLoss)]


def add_auxiliary(loss: torch.Tensor, modules: Iterable[AuxiliaryLoss]) -> torch.Tensor:
    """``loss`` plus every module's term of its last forward. A method with its own step
    loop (not :func:`train_steps`) calls this after each forward to train with the terms."""
    for m in modules:
        if (term := m.pop_auxiliary_loss()) is not None:
            loss = loss + term
    return loss


def auxiliary_metrics(modules: Iterable[AuxiliaryLoss]) -> dict[str, float]:
    """The modules' metrics since their last report (e.g. codebook perplexity)."""
    out: dict[str, float] = {}
    for m in modules:
        out |= m.auxiliary_metrics()
    return out


def make_optimizer(
    params: Iterable[torch.nn.Parameter], ctx: ClientContext
) -> torch.optim.Optimizer:
    """The configured optimiser at this round's learning rate."""
    t, lr = ctx.train, ctx.lr()
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def restore_optimizer_state(
    opt: torch.optim.Optimizer, model: nn.Module, ctx: ClientContext
) -> None:
    """With ``train.keep_optimizer_state``, give ``opt``'s parameters the state (momentum,
    Adam moments) they had at the end of the site's previous round, matched by name."""
    if not ctx.train.keep_optimizer_state or not ctx.optimizer_state:
        return
    names = _names(model)
    for group in opt.param_groups:
        for p in group["params"]:
            saved = ctx.optimizer_state.get(names.get(id(p), ""))
            if saved is not None:
                opt.state[p] = {
                    k: v.to(p.device).clone() if torch.is_tensor(v) else v for k, v in saved.items()
                }


def save_optimizer_state(opt: torch.optim.Optimizer, model: nn.Module, ctx: ClientContext) -> None:
    """With ``train.keep_optimizer_state``, record ``opt``'s per-parameter state by name in
    ``ctx.optimizer_state`` (the engine keeps it with the site's private state)."""
    if not ctx.train.keep_optimizer_state:
        return
    names = _names(model)
    for p, st in opt.state.items():
        if id(p) in names:
            ctx.optimizer_state[names[id(p)]] = {
                k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in st.items()
            }


def segmentation_loss(ctx: ClientContext) -> LossFn:
    """The supervised loss for this federation's labels (see ``TrainSettings.loss``)."""
    spec, kind = ctx.spec, ctx.train.loss
    if kind == "auto":
        kind = "pce" if spec.labels == "weak" else "ce_dice"
    if kind == "pce":
        return PartialCrossEntropy(spec.ignore_index)
    if kind == "dice_bce":
        return DiceBCELoss()
    if kind in ("dice", "dice_foreground"):
        background = kind == "dice"
        return SoftDiceLoss(
            spec.num_classes, ignore_index=spec.ignore_index, include_background=background
        )
    ce = PartialCrossEntropy(spec.ignore_index)
    dice = SoftDiceLoss(spec.num_classes, ignore_index=spec.ignore_index)
    return lambda logits, y: 0.5 * ce(logits, y) + 0.5 * dice(logits, y)


class StepLoop(Protocol):
    """The optimiser steps of :func:`train_steps`: ``iters`` steps of ``opt`` on the site's
    data, returning at least the mean ``loss``. :func:`step_loop` replaces the plain one,
    e.g. with DP-SGD (:mod:`fedseg.privacy.local`)."""

    def __call__(
        self,
        model: nn.Module,
        ctx: ClientContext,
        opt: torch.optim.Optimizer,
        loss_fn: LossFn,
        iters: int,
        regularizer: Callable[[], torch.Tensor] | None,
    ) -> dict[str, float]: ...


_STEP_LOOP: ContextVar[StepLoop | None] = ContextVar("fedseg_step_loop", default=None)


@contextmanager
def step_loop(loop: StepLoop) -> Iterator[StepLoop]:
    """Within this block every :func:`train_steps` call steps with ``loop``."""
    token = _STEP_LOOP.set(loop)
    try:
        yield loop
    finally:
        _STEP_LOOP.reset(token)


def train_steps(
    model: nn.Module,
    ctx: ClientContext,
    loss_fn: LossFn | None = None,
    params: Iterable[nn.Parameter] | None = None,
    iters: int | None = None,
    regularizer: Callable[[], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Run ``iters`` (default :meth:`ClientContext.steps`) optimiser steps on the site's
    batches.

    ``params`` restricts what is optimised (default: all trainable parameters);
    ``regularizer`` adds a term such as FedProx's proximal penalty, and every
    :class:`AuxiliaryLoss` sub-module of ``model`` its own term. Returns the mean loss (all
    terms) and the auxiliary modules' metrics. With ``train.keep_optimizer_state`` the
    optimiser continues from the site's last round. Forwards and losses run under the
    current :func:`precision` (autocast; ``fp16`` scales gradients; channels-last). Within
    a :func:`step_loop` block that loop makes the steps.
    """
    loss_fn = loss_fn or segmentation_loss(ctx)
    chosen = (
        list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    )
    opt = make_optimizer(chosen, ctx)
    restore_optimizer_state(opt, _owner(model), ctx)
    model.train()
    n = ctx.steps() if iters is None else iters
    loop = _STEP_LOOP.get() or _batch_steps
    with channels_last_model(model):
        metrics = loop(model, ctx, opt, loss_fn, n, regularizer)
    save_optimizer_state(opt, _owner(model), ctx)
    return metrics | auxiliary_metrics(auxiliary_modules(model))


def _batch_steps(
    model: nn.Module,
    ctx: ClientContext,
    opt: torch.optim.Optimizer,
    loss_fn: LossFn,
    iters: int,
    regularizer: Callable[[], torch.Tensor] | None,
) -> dict[str, float]:
    """The plain :class:`StepLoop`: one step per batch of ``ctx.batches``."""
    aux = auxiliary_modules(model)
    scaler = grad_scaler(ctx.device)  # fp16 off CUDA: autocast refuses
    total = 0.0
    for _ in range(iters):
        images, labels = next(ctx.batches)
        with autocast(ctx.device):
            loss = add_auxiliary(loss_fn(model(memory_format(images)), labels), aux)
            if regularizer is not None:
                loss = loss + regularizer()
        backward_step(opt, loss, scaler, ctx.train.grad_clamp)
        total += float(loss.detach())
    return {"loss": total / max(iters, 1)}


def _owner(model: nn.Module) -> nn.Module:
    """The network whose parameter names key the optimiser state (views such as
    ``DualOutputs`` wrap it as ``.net``)."""
    inner = getattr(model, "net", None)
    return inner if isinstance(inner, nn.Module) else model
