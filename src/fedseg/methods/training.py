"""Local-training building blocks shared by methods: optimiser, loss, a step loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from fedseg.losses import DiceBCELoss, PartialCrossEntropy, SoftDiceLoss
from fedseg.methods.base import ClientContext

__all__ = ["LossFn", "make_optimizer", "segmentation_loss", "train_steps"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(
    params: Iterable[torch.nn.Parameter], ctx: ClientContext
) -> torch.optim.Optimizer:
    """The configured optimiser at this round's learning rate."""
    t, lr = ctx.train, ctx.lr()
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=t.weight_decay)
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=t.weight_decay)


def segmentation_loss(ctx: ClientContext) -> LossFn:
    """The supervised loss for this federation's labels (see ``TrainSettings.loss``)."""
    spec, kind = ctx.spec, ctx.train.loss
    if kind == "auto":
        kind = "pce" if spec.labels == "weak" else "ce_dice"
    if kind == "pce":
        return PartialCrossEntropy(spec.ignore_index)
    if kind == "dice_bce":
        return DiceBCELoss()
    ce = PartialCrossEntropy(spec.ignore_index)
    dice = SoftDiceLoss(spec.num_classes, ignore_index=spec.ignore_index)
    return lambda logits, y: 0.5 * ce(logits, y) + 0.5 * dice(logits, y)


def train_steps(
    model: nn.Module,
    ctx: ClientContext,
    loss_fn: LossFn | None = None,
    params: Iterable[nn.Parameter] | None = None,
    iters: int | None = None,
    regularizer: Callable[[], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Run ``iters`` (default ``train.local_iters``) optimiser steps on the site's batches.

    ``params`` restricts what is optimised (default: all trainable parameters);
    ``regularizer`` adds a term such as FedProx's proximal penalty. Returns the mean loss.
    """
    loss_fn = loss_fn or segmentation_loss(ctx)
    chosen = (
        list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    )
    opt = make_optimizer(chosen, ctx)
    model.train()
    n = ctx.train.local_iters if iters is None else iters
    total = 0.0
    for _ in range(n):
        images, labels = next(ctx.batches)
        loss = loss_fn(model(images), labels)
        if regularizer is not None:
            loss = loss + regularizer()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach())
    return {"loss": total / max(n, 1)}
