"""Surface distances between two binary masks via Euclidean distance transforms."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
from scipy import ndimage

__all__ = ["surface_distances"]


@cache
def _cross(ndim: int) -> np.ndarray:
    """The connectivity-1 structuring element (a cross) in ``ndim`` dimensions."""
    cross: np.ndarray = ndimage.generate_binary_structure(ndim, 1)
    return cross


def _bounding_box(mask: np.ndarray) -> tuple[slice, ...]:
    """The smallest window holding every ``True`` element of a non-empty ``mask``."""
    box = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(mask.any(axis=others))
        box.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(box)


def _surface(mask: np.ndarray) -> np.ndarray:
    """Object pixels with a 4-/6-neighbour outside the object (or outside the image)."""
    eroded = ndimage.binary_erosion(mask, structure=_cross(mask.ndim), border_value=0)
    surface: np.ndarray = mask & ~eroded
    return surface


def surface_distances(
    pred: np.ndarray, target: np.ndarray, spacing: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Directed surface distances between two non-empty boolean masks of one shape.

    The surface of a mask is the mask minus its erosion by a connectivity-1 cross, with
    everything outside the image counted as background (medpy's ``connectivity=1``).
    Both masks are cropped to the bounding box of their union first, which changes no
    distance: outside that box both masks are background.

    Parameters
    ----------
    pred, target
        Boolean masks, each with at least one ``True`` element.
    spacing
        Physical size of one element along each axis; ``None`` measures in elements.

    Returns
    -------
    tuple of numpy.ndarray
        Distances from every surface element of ``pred`` to the nearest surface element of
        ``target``, and from every surface element of ``target`` to that of ``pred``.
    """
    box = _bounding_box(pred | target)
    pred_surface, target_surface = _surface(pred[box]), _surface(target[box])
    to_target = ndimage.distance_transform_edt(~target_surface, sampling=spacing)
    to_pred = ndimage.distance_transform_edt(~pred_surface, sampling=spacing)
    return to_target[pred_surface], to_pred[target_surface]
