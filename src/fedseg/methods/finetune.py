"""Fine-tuning of a site's model at evaluation: settings and the constant-rate training
loop shared by FedBABU and FedDP (their personalisation step after federation)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field
from torch import nn

from fedseg.methods.base import ClientContext, MethodConfig, batches_per_epoch
from fedseg.methods.training import LossFn, train_steps
from fedseg.methods.wss import WSSMethod

__all__ = ["FineTuneConfig", "fine_tune", "fine_tune_steps"]


class FineTuneConfig(MethodConfig):
    """Fine-tuning settings of a method that personalises by local training at evaluation."""

    ft_epochs: int = Field(5, ge=0)
    """Fine-tuning epochs before evaluation (0: no fine-tuning)."""
    ft_epoch_iters: int | None = Field(None, gt=0)
    """Optimiser steps in one fine-tuning epoch (default: one pass over the site's training
    data; FedDP's code draws 300 images an epoch whatever the site's size, 38 batches of 8)."""
    ft_lr: float | None = Field(None, gt=0)
    """Constant fine-tuning learning rate (default: ``train.lr``, the base rate)."""
    ft_scope: Literal["all", "head"] = "all"
    """Fine-tune every weight (``all``) or only the task head ``decoder.head`` (``head``)."""


def fine_tune_steps(cfg: FineTuneConfig, ctx: ClientContext) -> int:
    """Optimiser steps of ``cfg.ft_epochs`` epochs of ``cfg.ft_epoch_iters`` steps, by
    default passes over the site's training data."""
    per_epoch = cfg.ft_epoch_iters or batches_per_epoch(ctx.site.num_train, ctx.train.batch_size)
    return cfg.ft_epochs * per_epoch


def fine_tune(
    method: WSSMethod,
    model: nn.Module,
    ctx: ClientContext,
    cfg: FineTuneConfig,
    *,
    objective: nn.Module | None = None,
    loss_fn: LossFn | None = None,
) -> dict[str, float]:
    """Train ``model`` in place for :func:`fine_tune_steps` steps at the constant rate
    ``cfg.ft_lr`` (default ``train.lr``) with a fresh optimiser, without ``train.grad_clamp``
    (FedDP's and FedBABU's code clamp the rounds' gradients, not the fine-tuning's).

    Trains the head (``ft_scope: head``) or every trainable weight of ``model``.
    ``objective`` / ``loss_fn`` replace the method's own network view and loss (e.g. a view
    that also returns an ensemble's predictions); both or neither must be given.
    """
    train = ctx.train.model_copy(
        update={"lr": cfg.ft_lr or ctx.train.lr, "lr_schedule": "constant", "grad_clamp": None}
    )
    ft_ctx = replace(ctx, train=train)
    scope = model.get_submodule("decoder.head") if cfg.ft_scope == "head" else model
    params = [p for p in scope.parameters() if p.requires_grad]
    iters = fine_tune_steps(cfg, ctx)
    if objective is None or loss_fn is None:
        if objective is not None or loss_fn is not None:
            raise ValueError("fine_tune: give both objective and loss_fn, or neither")
        return method.local_train(model, ft_ctx, params=params, iters=iters)
    return train_steps(objective, ft_ctx, loss_fn, params=params, iters=iters)
