"""Segmentation losses on logits ``[B, C, *S]`` against integer label maps ``[B, *S]``.

Every loss accepts 2D or 3D spatial shapes ``S`` and targets with or without a singleton
channel axis (``[B, 1, *S]``). Invalid shapes, dtypes or label values raise ``ValueError``
naming what was expected and what was found.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DiceBCELoss", "PartialCrossEntropy", "SoftDiceLoss", "soft_dice_loss"]


def soft_dice_loss(
    probs: torch.Tensor,
    onehot: torch.Tensor,
    *,
    include_background: bool = True,
    batch: bool = True,
    smooth: float = 1e-5,
) -> torch.Tensor:
    """``1 - (2 sum(p t) + smooth) / (sum p + sum t + smooth)`` per class (and per sample
    unless ``batch``), averaged: the definition of MONAI's ``DiceLoss`` (tested equal), without
    importing MONAI (seconds at every start-up) for one formula."""
    if not include_background:
        probs, onehot = probs[:, 1:], onehot[:, 1:]
    axes = tuple(range(2, probs.ndim))
    if batch:
        axes = (0, *axes)
    inter = (probs * onehot).sum(axes)
    denom = probs.sum(axes) + onehot.sum(axes)
    return (1.0 - (2.0 * inter + smooth) / (denom + smooth)).mean()


def _label_map(logits: torch.Tensor, target: torch.Tensor, loss: str) -> torch.Tensor:
    """``target`` as ``[B, *S]`` matching ``logits`` ``[B, C, *S]``; checks shape and dtype."""
    if logits.ndim not in (3, 4, 5):
        raise ValueError(
            f"{loss}: logits must be [B, C, *S] with 1 to 3 spatial dims, "
            f"got shape {tuple(logits.shape)}"
        )
    expected = (logits.shape[0], *logits.shape[2:])
    if target.ndim == logits.ndim and target.shape[1] == 1:
        target = target[:, 0]
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{loss}: target must be [B, *S] = {expected} (or [B, 1, *S]) to match logits "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    if target.is_floating_point() or target.is_complex():
        raise ValueError(f"{loss}: target must hold integer labels, got dtype {target.dtype}")
    return target.long()


def _check_labels(
    target: torch.Tensor, num_classes: int, ignore_index: int | None, loss: str
) -> torch.Tensor:
    """The mask of labeled pixels; raises if a labeled pixel is outside ``[0, num_classes)``."""
    labeled = torch.ones_like(target, dtype=torch.bool)
    if ignore_index is not None:
        labeled = target != ignore_index
    values = target[labeled]
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= num_classes):
        raise ValueError(
            f"{loss}: labels must lie in [0, {num_classes}) or equal ignore_index="
            f"{ignore_index}, got range [{int(values.min())}, {int(values.max())}]"
        )
    return labeled


class PartialCrossEntropy(nn.Module):
    """Cross-entropy averaged over labeled pixels only (pCE for scribble/point labels).

    Pixels equal to ``ignore_index`` contribute nothing. A batch without any labeled
    pixel gives a loss of 0 that still carries a (zero) gradient, instead of NaN.

    Parameters
    ----------
    ignore_index
        Label value of unlabeled pixels (fedseg uses ``num_classes``).
    """

    def __init__(self, ignore_index: int) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of ``logits`` ``[B, C, *S]`` over labeled pixels of ``target``."""
        target = _label_map(logits, target, type(self).__name__)
        labeled = _check_labels(target, logits.shape[1], self.ignore_index, type(self).__name__)
        total = F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction="sum")
        return total / labeled.sum().clamp(min=1)


class SoftDiceLoss(nn.Module):
    """Soft Dice loss of softmax probabilities against one-hot integer targets.

    Ignored pixels are removed from both the probabilities and the one-hot target before
    :func:`soft_dice_loss` computes ``1 - (2 sum(p t) + smooth) / (sum p + sum t + smooth)``
    per class and averages over classes (and over samples when ``batch=False``), as MONAI's
    ``DiceLoss``.

    Parameters
    ----------
    num_classes
        Number of classes, i.e. logit channels.
    ignore_index
        Label value of unlabeled pixels, or ``None`` when every pixel is labeled.
    include_background
        Whether class 0 enters the average (default ``True``, as MONAI and FedLPPA).
    batch
        Sum over the whole batch before dividing (default, as FedLPPA/FedBCS) rather than
        one Dice per sample.
    smooth
        Added to numerator and denominator; a class absent from both sides scores 0 loss.
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int | None = None,
        include_background: bool = True,
        batch: bool = True,
        smooth: float = 1e-5,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"SoftDiceLoss: num_classes must be >= 2, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.include_background, self.batch, self.smooth = include_background, batch, smooth

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Soft Dice loss of ``logits`` ``[B, C, *S]`` against labels ``[B, *S]``."""
        name = type(self).__name__
        if logits.ndim < 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"{name}: logits must have {self.num_classes} channels, "
                f"got shape {tuple(logits.shape)}"
            )
        target = _label_map(logits, target, name)
        labeled = _check_labels(target, self.num_classes, self.ignore_index, name)
        probs = torch.softmax(logits, dim=1)
        onehot = F.one_hot(torch.where(labeled, target, 0), self.num_classes)
        onehot = onehot.movedim(-1, 1).to(probs.dtype)
        if self.ignore_index is not None:
            keep = labeled.unsqueeze(1).to(probs.dtype)
            probs, onehot = probs * keep, onehot * keep
        return soft_dice_loss(
            probs,
            onehot,
            include_background=self.include_background,
            batch=self.batch,
            smooth=self.smooth,
        )


class DiceBCELoss(nn.Module):
    """Binary segmentation loss ``lambda_dice * Dice + lambda_bce * BCE`` on logits.

    Logits may have 1 channel (the foreground logit ``z``) or 2 channels
    ``[z0, z1]``, which are reduced to ``z = z1 - z0``: ``sigmoid(z1 - z0)`` equals the
    softmax foreground probability, so BCE on it equals 2-class cross-entropy. Dice is
    the soft Dice of ``sigmoid(z)`` against the foreground mask (:func:`soft_dice_loss`);
    BCE is ``binary_cross_entropy_with_logits``, averaged over pixels.

    Parameters
    ----------
    lambda_dice, lambda_bce
        Weights of the two terms.
    batch
        Sum the Dice over the whole batch (default) rather than per sample.
    smooth
        Dice smoothing added to numerator and denominator.
    """

    def __init__(
        self,
        lambda_dice: float = 1.0,
        lambda_bce: float = 1.0,
        batch: bool = True,
        smooth: float = 1e-5,
    ) -> None:
        super().__init__()
        self.lambda_dice = lambda_dice
        self.lambda_bce = lambda_bce
        self.batch, self.smooth = batch, smooth

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Loss of ``logits`` ``[B, 1 or 2, *S]`` against a 0/1 label map ``[B, *S]``."""
        name = type(self).__name__
        if logits.ndim < 2 or logits.shape[1] not in (1, 2):
            raise ValueError(
                f"{name}: logits must have 1 or 2 channels, got shape {tuple(logits.shape)}"
            )
        target = _label_map(logits, target, name)
        _check_labels(target, 2, None, name)
        z = logits if logits.shape[1] == 1 else logits[:, 1:] - logits[:, :1]
        y = target.unsqueeze(1).to(z.dtype)
        bce = F.binary_cross_entropy_with_logits(z, y)
        dice = soft_dice_loss(torch.sigmoid(z), y, batch=self.batch, smooth=self.smooth)
        return self.lambda_dice * dice + self.lambda_bce * bce
