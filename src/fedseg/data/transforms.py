"""Batched training augmentation in torch, identical for 2D and 3D samples."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["Rotation", "augment"]

Rotation = Literal["right_angles", "paper_45"]
"""``right_angles``: k x 90 degrees; ``paper_45``: any angle in [-45, 45] degrees (FedLPPA
Sec. IV-A)."""


def augment(
    images: torch.Tensor,
    labels: torch.Tensor,
    generator: torch.Generator,
    *,
    scale: float = 0.1,
    shift: float = 0.1,
    rotation: Rotation = "right_angles",
    ignore_index: int = 255,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomly flip and rotate each sample in its last two axes, then scale and shift its
    intensities.

    Labels get exactly the same geometric transform; intensity changes touch images only.
    ``right_angles`` rotates by k x 90 degrees (90/270 need square last two axes; otherwise
    only 0/180 are drawn). ``paper_45`` rotates by an angle drawn uniformly from [-45, 45]
    degrees, as FedLPPA's augmentation (Sec. IV-A): images are resampled bilinearly, labels
    by nearest neighbour, and pixels rotated in from outside the image become 0 in the image
    and ``ignore_index`` in the label (the authors' code fills labels with the unlabeled
    value too). All randomness comes from ``generator`` (on the CPU), so a seeded generator
    reproduces the batch exactly.

    Args:
        images: [N, C, *spatial] float tensor (2 or 3 spatial axes).
        labels: [N, *spatial] integer tensor.
        generator: source of randomness.
        scale: intensities are multiplied by a factor drawn from [1 - scale, 1 + scale].
        shift: and shifted by an offset drawn from [-shift, shift] (per sample).
        rotation: ``right_angles`` or ``paper_45``.
        ignore_index: label of pixels with no source (``paper_45`` only).

    Returns:
        The augmented ``(images, labels)``; the inputs are not modified.
    """
    if images.shape[0] != labels.shape[0] or images.shape[2:] != labels.shape[1:]:
        raise ValueError(
            f"images [N, C, *spatial] and labels [N, *spatial] must agree, got "
            f"{tuple(images.shape)} and {tuple(labels.shape)}"
        )
    if rotation not in ("right_angles", "paper_45"):
        raise ValueError(f"rotation must be 'right_angles' or 'paper_45', got {rotation!r}")
    n = images.shape[0]
    draws = torch.rand(n, 5, generator=generator)
    x, y = images, labels
    for axis, coin in ((-1, draws[:, 0]), (-2, draws[:, 1])):
        x = _where(coin < 0.5, x.flip(axis), x)
        y = _where(coin < 0.5, y.flip(axis), y)
    if rotation == "paper_45":
        rotated_x, rotated_y = _rotate(x, y, (draws[:, 2] * 90 - 45) * math.pi / 180, ignore_index)
    else:
        rotated_x, rotated_y = _right_angles(x, y, draws[:, 2])
    factor = (1 - scale + 2 * scale * draws[:, 3]).to(images)
    offset = (-shift + 2 * shift * draws[:, 4]).to(images)
    view = (n,) + (1,) * (images.dim() - 1)
    return rotated_x * factor.view(view) + offset.view(view), rotated_y


def _where(chosen: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample choice between two batches of the same shape."""
    mask = chosen.to(a.device).view((-1,) + (1,) * (a.dim() - 1))
    return torch.where(mask, a, b)


def _right_angles(
    x: torch.Tensor, y: torch.Tensor, draw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each sample by k x 90 degrees (k from ``draw``; 0/180 for non-square planes)."""
    quarter_turns = 4 if x.shape[-1] == x.shape[-2] else 2
    turns = (draw * quarter_turns).long() * (4 // quarter_turns)
    rotated_x, rotated_y = x, y
    for k in range(1, 4):
        if (turns == k).any():
            chosen = turns == k
            rotated_x = _where(chosen, torch.rot90(x, k, dims=(-2, -1)), rotated_x)
            rotated_y = _where(chosen, torch.rot90(y, k, dims=(-2, -1)), rotated_y)
    return rotated_x, rotated_y


def _rotate(
    x: torch.Tensor, y: torch.Tensor, angles: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each sample by ``angles`` (radians) about the centre of its last two axes."""
    n, h, w = x.shape[0], x.shape[-2], x.shape[-1]
    cos, sin = torch.cos(angles), torch.sin(angles)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin * h / w  # normalised coordinates: keep the
    theta[:, 1, 0], theta[:, 1, 1] = sin * w / h, cos  # rotation rigid on non-square planes
    planes_x = x.reshape(n, -1, h, w)
    grid = F.affine_grid(theta.to(x), list(planes_x.shape), align_corners=False)
    out_x = F.grid_sample(planes_x, grid, mode="bilinear", align_corners=False)
    planes_y = (y.reshape(n, -1, h, w) + 1).to(grid.dtype)  # 0 marks "from outside"
    out_y = F.grid_sample(planes_y, grid, mode="nearest", align_corners=False).round().long()
    out_y = torch.where(out_y == 0, ignore_index, out_y - 1).to(y.dtype)
    return out_x.reshape(x.shape), out_y.reshape(y.shape)
