"""Dimension-generic layer factories: one code path for 2D and 3D networks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "NORMS",
    "Norm",
    "batch_norm",
    "conv",
    "dropout",
    "max_pool",
    "norm",
    "resize_nearest",
    "upsample_mode",
]

Norm = Literal["batch", "batch_stats", "instance", "group"]
"""Normalisation of conv blocks: BatchNorm (affine, running statistics), ``batch_stats``
(BatchNorm without affine parameters or running statistics: batch statistics in training
and evaluation, as HarmoFL's and FedBCS's UNet), InstanceNorm (affine) or GroupNorm."""
NORMS: tuple[Norm, ...] = ("batch", "batch_stats", "instance", "group")


def _check(ndim: int) -> int:
    if ndim not in (2, 3):
        raise ValueError(f"ndim must be 2 or 3, got {ndim}")
    return ndim


def conv(ndim: int, in_ch: int, out_ch: int, kernel_size: int = 3, **kw: object) -> nn.Module:
    """``Conv2d``/``Conv3d`` with 'same' padding for odd kernels."""
    cls = nn.Conv2d if _check(ndim) == 2 else nn.Conv3d
    return cls(in_ch, out_ch, kernel_size, padding=kernel_size // 2, **kw)  # type: ignore[arg-type]


def batch_norm(ndim: int, channels: int) -> nn.Module:
    """``BatchNorm2d``/``BatchNorm3d``."""
    return (nn.BatchNorm2d if _check(ndim) == 2 else nn.BatchNorm3d)(channels)


def norm(ndim: int, channels: int, kind: Norm = "batch", groups: int = 8) -> nn.Module:
    """The normalisation layer ``kind`` (see :data:`Norm`) for ``channels`` channels."""
    _check(ndim)
    if kind == "batch":
        return batch_norm(ndim, channels)
    if kind == "batch_stats":
        cls = nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d
        return cls(channels, affine=False, track_running_stats=False)
    if kind == "instance":
        return (nn.InstanceNorm2d if ndim == 2 else nn.InstanceNorm3d)(channels, affine=True)
    if kind == "group":
        if channels % groups:
            raise ValueError(f"group norm: {channels} channels are not divisible by {groups}")
        return nn.GroupNorm(groups, channels)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


def dropout(ndim: int, p: float) -> nn.Module:
    """Plain element-wise dropout (the PyMIC UNet uses ``nn.Dropout``)."""
    _check(ndim)
    return nn.Dropout(p)


def max_pool(ndim: int) -> nn.Module:
    """Factor-2 max pooling."""
    return (nn.MaxPool2d if _check(ndim) == 2 else nn.MaxPool3d)(2)


def upsample_mode(ndim: int) -> str:
    """Interpolation mode for factor-2 feature upsampling."""
    return "bilinear" if _check(ndim) == 2 else "trilinear"


def resize_nearest(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """``F.interpolate(x, size, mode="nearest")`` for ``[B, C, *S]`` tensors, without its
    slow CPU path for contiguous tensors (10-25x slower than channels-last, measured in
    docs/benchmarks_speed.md) where every side scales by an integer factor: upsampling
    repeats each pixel (expand + reshape), downsampling keeps every f-th one (a strided
    view), which is what legacy nearest computes then. Other sizes go to ``F.interpolate``."""
    src, size = tuple(x.shape[2:]), tuple(int(s) for s in size)
    if src == size:
        return x
    if all(o % i == 0 for i, o in zip(src, size, strict=True)):
        f = [o // i for i, o in zip(src, size, strict=True)]
        index: list[slice | None] = [slice(None), slice(None)]
        shape = list(x.shape[:2])
        for n, k in zip(src, f, strict=True):
            index += [slice(None), None]
            shape += [n, k]
        return x[tuple(index)].expand(shape).reshape(*x.shape[:2], *size)
    if all(i % o == 0 for i, o in zip(src, size, strict=True)):
        steps = [slice(None, None, i // o) for i, o in zip(src, size, strict=True)]
        return x[(slice(None), slice(None), *steps)]
    return F.interpolate(x, size=size, mode="nearest")
