"""Learnable (adaptive) local aggregation: element-wise weights between old and new weights.

For every chosen state-dict key ``k`` a site keeps a weight tensor ``W[k]`` of the same shape,
initialised to ones and kept in ``[0, 1]``::

    merged[k] = prev[k] + (glob[k] - prev[k]) * W[k]

``prev`` is the site's own tensor from its last round, ``glob`` what the server sent.
``W = 1`` takes the server's tensor, ``W = 0`` keeps the local one. Because
``d merged / d W = glob - prev``, one gradient step on a local loss is::

    W <- clip(W - eta * dL/dmerged * (glob - prev), 0, 1)

This is FedALA's rule (Zhang et al., AAAI 2023) and FedLPPA's Eqs. 10-13, where Eqs. 10-11
(merge) and 12-13 (weight step) alternate. FedICRA's aggregation is the same mechanism.

API
---
``init_weights(glob, keys) -> dict[str, Tensor]``
    Ones shaped like ``glob[k]``. The caller stores the weights in the site's private state
    and passes them back every round (they persist across rounds).
``merge(prev, glob, weights) -> dict[str, Tensor]``
    The merged tensors for every key of ``glob``. Keys without a weight (e.g. BN running
    statistics, or layers the method does not adapt) take ``glob``'s value.
``train_weights(model, prev, glob, weights, batches, loss_fn, *, eta, steps, settle, ...)``
    Loads the merge into ``model`` (keys of ``glob`` only), trains the weights and leaves the
    final merge loaded. Returns :class:`LAResult` (new weights, merged tensors, step count,
    losses, whether the loss settled, whether it was skipped).

    - ``loss_fn(model, images, labels) -> loss`` computes the local loss of one batch.
    - ``steps`` gradient steps; or, with ``settle=True`` (FedALA's first round), passes of
      ``pass_steps`` batches until the standard deviation of the last ``window`` pass losses
      (each the loss of the pass's last batch) drops below ``tol`` (needs more than
      ``window`` passes), at most ``max_steps`` steps.
    - ``settled`` says whether the loss settled (``False`` when ``max_steps`` was hit).
    - ``update="adam"`` replaces the plain step by an Adam step on the same gradient
      (``dL/dmerged * (glob - prev)``; moments start at 0 in every call, betas (0.9, 0.999),
      eps 1e-8, no weight decay), so ``eta`` is the size of a step of ``W`` whatever the
      scale of the gradient; ``W`` is clipped to ``[0, 1]`` after every step either way.
    - Skipped (``steps == 0``, ``skipped=True``) when ``glob == prev`` on every weighted key,
      e.g. in the first round: the gradient of ``W`` would be zero.
    - Only ``W`` is trained; model buffers (BN statistics) are restored afterwards, so the
      only side effect on ``model`` is the loaded merge.
``last_parameters(model, n) -> list[str]``
    Names of the last ``n`` trainable parameters (FedALA's "top layers", ``layer_idx``).

Example (FedALA-style, in a client step)::

    keys = last_parameters(model, 2)
    w = state.get("ala") or init_weights(payload.tensors, keys)
    first = not state.get("ala_started", False)
    res = train_weights(model, prev, payload.tensors, w, batches, loss, eta=1.0,
                        steps=pass_steps, settle=first, pass_steps=pass_steps,
                        max_steps=50 * pass_steps)
    # the settling phase happens once: in the first call that is not skipped
    state["ala"], state["ala_started"] = res.weights, not first or not res.skipped
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.training import autocast, channels_last_model, memory_format

__all__ = [
    "LAResult",
    "LossOfModel",
    "init_weights",
    "last_parameters",
    "merge",
    "train_weights",
    "train_weights_by_pass",
]

LossOfModel = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(model, images, labels)``: the local loss of one batch."""


@dataclass
class LAResult:
    """Outcome of :func:`train_weights`."""

    weights: dict[str, torch.Tensor]
    merged: dict[str, torch.Tensor]
    steps: int
    losses: list[float] = field(default_factory=list)
    settled: bool = False
    skipped: bool = False


def init_weights(glob: Mapping[str, torch.Tensor], keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """All-ones weights shaped like ``glob[k]`` for each of ``keys`` (float tensors only)."""
    bad = [k for k in keys if k not in glob or not glob[k].is_floating_point()]
    if bad:
        raise ConfigError(f"learnable aggregation: keys {bad[:3]} are not float tensors of glob")
    return {k: torch.ones_like(glob[k], dtype=torch.float32) for k in keys}


def merge(
    prev: Mapping[str, torch.Tensor],
    glob: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """``prev + (glob - prev) * W`` for weighted keys, ``glob`` for the others."""
    out = {}
    for k, g in glob.items():
        if k in weights:
            p = prev[k].to(g.device, g.dtype)
            out[k] = (p + (g - p) * weights[k].to(g.device, g.dtype)).detach()
        else:
            out[k] = g.detach().clone()
    return out


def last_parameters(model: nn.Module, n: int) -> list[str]:
    """Names of the last ``n`` trainable parameters in registration order."""
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    if not 0 < n <= len(names):
        raise ConfigError(f"learnable aggregation: need 0 < n <= {len(names)} layers, got {n}")
    return names[-n:]


def _settled(losses: list[float], window: int, tol: float) -> bool:
    if len(losses) <= window:
        return False
    return float(torch.tensor(losses[-window:]).std(unbiased=False)) < tol


def train_weights(
    model: nn.Module,
    prev: Mapping[str, torch.Tensor],
    glob: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: LossOfModel,
    *,
    eta: float = 1.0,
    steps: int = 1,
    settle: bool = False,
    max_steps: int = 100,
    window: int = 10,
    tol: float = 0.1,
    pass_steps: int = 1,
    update: Literal["sgd", "adam"] = "sgd",
) -> LAResult:
    """Train the aggregation weights on local batches; see the module docstring."""
    if update not in ("sgd", "adam"):
        raise ConfigError(f"learnable aggregation: update must be sgd or adam, got {update!r}")
    params = dict(model.named_parameters())
    missing = [k for k in weights if k not in params or k not in glob or k not in prev]
    if missing:
        raise ConfigError(
            f"learnable aggregation: weighted keys {missing[:3]} must be model parameters "
            "present in both prev and glob"
        )
    dev = next(iter(params.values())).device
    w = {k: v.detach().to(dev, torch.float32).clone() for k, v in weights.items()}
    base = {k: prev[k].detach().to(dev, torch.float32) for k in w}
    diff = {k: glob[k].detach().to(dev, torch.float32) - base[k] for k in w}
    model.load_state_dict(merge(prev, glob, weights), strict=False)
    out_dev = next(iter(weights.values())).device if weights else dev
    if not w or all(not bool(d.any()) for d in diff.values()):
        return LAResult(
            {k: v.to(out_dev) for k, v in w.items()}, merge(prev, glob, w), 0, skipped=True
        )

    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    was_training = model.training
    model.train()
    keys = list(w)
    chosen = [params[k] for k in keys]
    budget = max_steps if settle else steps
    losses: list[float] = []
    pass_losses: list[float] = []
    settled = False
    moments = (
        {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in w.items()}
        if update == "adam"
        else {}
    )
    n = 0
    with channels_last_model(model):
        while n < budget:
            images, labels = next(batches)
            with autocast(dev):  # the engine's precision; no gradient scaler (fp16)
                loss = loss_fn(model, memory_format(images), labels)
            grads = torch.autograd.grad(loss, chosen, allow_unused=True)
            n += 1
            with torch.no_grad():
                for k, p, g in zip(keys, chosen, grads, strict=True):
                    if g is not None:
                        grad_w = g.float() * diff[k]
                        if update == "adam":
                            grad_w = _adam_direction(grad_w, *moments[k], n)
                        w[k] = (w[k] - eta * grad_w).clamp_(0.0, 1.0)
                    p.copy_((base[k] + diff[k] * w[k]).to(p.dtype))
            losses.append(float(loss.detach()))
            if settle and n % pass_steps == 0:
                pass_losses.append(losses[-1])
                if _settled(pass_losses, window, tol):
                    settled = True
                    break
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(buffers[k])
    model.train(was_training)
    merged = merge(prev, glob, w)
    return LAResult({k: v.to(out_dev) for k, v in w.items()}, merged, n, losses, settled)


def _adam_direction(grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int) -> torch.Tensor:
    """Adam's bias-corrected step direction at step ``t`` (updates the moments in place)."""
    m.mul_(0.9).add_(grad, alpha=0.1)
    v.mul_(0.999).addcmul_(grad, grad, value=0.001)
    return (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)


def train_weights_by_pass(
    model: nn.Module,
    prev: Mapping[str, torch.Tensor],
    glob: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: LossOfModel,
    *,
    per_pass: int,
    first: bool,
    max_passes: int,
    eta: float,
    window: int,
    tol: float,
) -> LAResult:
    """FedALA's schedule: one pass of ``per_pass`` batches per round, and in the first use
    passes until the per-pass loss settles (at most ``max_passes``)."""
    return train_weights(
        model,
        prev,
        glob,
        weights,
        batches,
        loss_fn,
        eta=eta,
        steps=per_pass,
        settle=first,
        max_steps=max_passes * per_pass,
        window=window,
        tol=tol,
        pass_steps=per_pass,
    )
