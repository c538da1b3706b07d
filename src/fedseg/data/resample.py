"""Resample 2D/3D arrays from their voxel spacing to a target spacing.

Geometry: voxel ``i`` of an axis with spacing ``s`` covers ``[i * s, (i + 1) * s)``, so the
array's first corner stays put and its physical extent is kept: ``n`` voxels at ``s`` become
``round(n * s / t)`` voxels at ``t`` (a 2 mm box resampled to 1 mm has twice as many voxels).
Every output voxel centre is sampled at its exact physical position in the input
(``scipy.ndimage.affine_transform``, edges replicated); the output spacing is ``t`` exactly.
Images interpolate linearly or by cubic B-spline; masks take the nearest voxel, so label values
never blend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy import ndimage

from fedseg.errors import DataError

__all__ = ["INTERPOLATIONS", "resample_image", "resample_mask", "resampled_shape"]

Interpolation = Literal["linear", "cubic"]
INTERPOLATIONS: tuple[str, ...] = ("linear", "cubic")
_ORDER = {"nearest": 0, "linear": 1, "cubic": 3}


def resampled_shape(
    shape: Sequence[int], spacing: Sequence[float], target: Sequence[float]
) -> tuple[int, ...]:
    """Spatial shape after resampling ``shape`` from ``spacing`` to ``target`` (at least 1)."""
    _check(len(shape), spacing, target)
    return tuple(max(1, round(n * s / t)) for n, s, t in zip(shape, spacing, target, strict=True))


def resample_image(
    image: np.ndarray,
    spacing: Sequence[float],
    target: Sequence[float],
    interpolation: Interpolation = "linear",
) -> np.ndarray:
    """``image`` resampled from ``spacing`` to ``target``, as float32.

    The last ``len(spacing)`` axes are spatial; leading axes (channels) are resampled alike.
    ``cubic`` may overshoot the input range a little near edges, as any cubic spline does.

    Raises:
        DataError: an unknown ``interpolation``, or spacings that are not positive and finite
            with one value per spatial axis.
    """
    if interpolation not in INTERPOLATIONS:
        raise DataError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    return _resample(np.asarray(image, np.float32), spacing, target, interpolation)


def resample_mask(
    mask: np.ndarray, spacing: Sequence[float], target: Sequence[float]
) -> np.ndarray:
    """Label map ``mask`` (spatial axes only) resampled from ``spacing`` to ``target`` by
    nearest neighbour; the dtype and the set of label values are kept.

    Raises:
        DataError: spacings that are not positive and finite with one value per axis.
    """
    if mask.ndim != len(spacing):
        raise DataError(
            f"a mask has spatial axes only: shape {mask.shape} needs {mask.ndim} spacing "
            f"values, got {tuple(spacing)}"
        )
    return _resample(np.asarray(mask), spacing, target, "nearest")


def _resample(
    array: np.ndarray, spacing: Sequence[float], target: Sequence[float], kind: str
) -> np.ndarray:
    spatial = len(spacing)
    if not 1 <= spatial <= array.ndim:
        raise DataError(
            f"spacing {tuple(spacing)} needs one value per spatial axis of the array "
            f"(shape {array.shape})"
        )
    lead = array.shape[: array.ndim - spatial]
    shape = resampled_shape(array.shape[array.ndim - spatial :], spacing, target)
    if shape == array.shape[array.ndim - spatial :] and tuple(spacing) == tuple(target):
        return array.copy()
    # output voxel j's centre, (j + 1/2) t, sits at input index (j + 1/2) t / s - 1/2
    scale = np.array([t / s for s, t in zip(spacing, target, strict=True)])
    offset = 0.5 * scale - 0.5
    flat = array.reshape((-1, *array.shape[array.ndim - spatial :]))
    out = np.stack(
        [
            ndimage.affine_transform(
                part,
                scale,
                offset=offset,
                output_shape=shape,
                output=array.dtype,
                order=_ORDER[kind],
                mode="nearest",
            )
            for part in flat
        ]
    )
    return out.reshape(lead + shape)


def _check(ndim: int, spacing: Sequence[float], target: Sequence[float]) -> None:
    for name, values in (("spacing", spacing), ("target spacing", target)):
        if len(values) != ndim or not all(
            isinstance(v, int | float | np.number) and math.isfinite(v) and v > 0 for v in values
        ):
            raise DataError(
                f"{name} must be {ndim} positive finite values (one per spatial axis), "
                f"got {tuple(values)}"
            )
