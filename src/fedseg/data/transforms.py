"""Batched training augmentation in torch, identical for 2D and 3D samples."""

from __future__ import annotations

import torch

__all__ = ["augment"]


def augment(
    images: torch.Tensor,
    labels: torch.Tensor,
    generator: torch.Generator,
    *,
    scale: float = 0.1,
    shift: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomly flip and rotate (by multiples of 90 degrees) each sample in its last two axes,
    then scale and shift its intensities.

    Labels get exactly the same geometric transform; intensity changes touch images only.
    Rotations by 90/270 degrees need square last two axes; otherwise only 0/180 are drawn.
    All randomness comes from ``generator`` (on the CPU), so a seeded generator reproduces the
    batch exactly.

    Args:
        images: [N, C, *spatial] float tensor (2 or 3 spatial axes).
        labels: [N, *spatial] integer tensor.
        generator: source of randomness.
        scale: intensities are multiplied by a factor drawn from [1 - scale, 1 + scale].
        shift: and shifted by an offset drawn from [-shift, shift] (per sample).

    Returns:
        The augmented ``(images, labels)``; the inputs are not modified.
    """
    if images.shape[0] != labels.shape[0] or images.shape[2:] != labels.shape[1:]:
        raise ValueError(
            f"images [N, C, *spatial] and labels [N, *spatial] must agree, got "
            f"{tuple(images.shape)} and {tuple(labels.shape)}"
        )
    n = images.shape[0]
    draws = torch.rand(n, 5, generator=generator)
    quarter_turns = 4 if images.shape[-1] == images.shape[-2] else 2
    turns = (draws[:, 2] * quarter_turns).long() * (4 // quarter_turns)
    x, y = images, labels
    for axis, coin in ((-1, draws[:, 0]), (-2, draws[:, 1])):
        x = _where(coin < 0.5, x.flip(axis), x)
        y = _where(coin < 0.5, y.flip(axis), y)
    rotated_x, rotated_y = x, y
    for k in range(1, 4):
        if (turns == k).any():
            chosen = turns == k
            rotated_x = _where(chosen, torch.rot90(x, k, dims=(-2, -1)), rotated_x)
            rotated_y = _where(chosen, torch.rot90(y, k, dims=(-2, -1)), rotated_y)
    factor = (1 - scale + 2 * scale * draws[:, 3]).to(images)
    offset = (-shift + 2 * shift * draws[:, 4]).to(images)
    view = (n,) + (1,) * (images.dim() - 1)
    return rotated_x * factor.view(view) + offset.view(view), rotated_y


def _where(chosen: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample choice between two batches of the same shape."""
    mask = chosen.to(a.device).view((-1,) + (1,) * (a.dim() - 1))
    return torch.where(mask, a, b)
