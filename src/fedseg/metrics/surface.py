"""Surface distances between two binary masks: exact nearest-surface Euclidean distances."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

__all__ = ["surface_distances"]

# Nearest-neighbour queries on the surface points cost about 0.7 µs per point, the two
# distance transforms about 0.08 µs (2D) and 0.25 µs (3D) per element of the cropped box:
# below this fraction of surface points per element, the queries are cheaper.
_TREE_FRACTION = {2: 0.1, 3: 0.3}


def _bounding_box(mask: np.ndarray) -> tuple[slice, ...]:
    """The smallest window holding every ``True`` element of a non-empty ``mask``."""
    box = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(mask.any(axis=others))
        box.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(box)


def _surface(mask: np.ndarray) -> np.ndarray:
    """Object elements with a 4-/6-neighbour outside the object (or outside the image):
    ``mask`` minus its erosion by the connectivity-1 cross with a background border."""
    padded = np.zeros(tuple(n + 2 for n in mask.shape), dtype=bool)
    padded[tuple(slice(1, n + 1) for n in mask.shape)] = mask
    inner = tuple(slice(1, n + 1) for n in mask.shape)
    interior = mask.copy()
    for axis, n in enumerate(mask.shape):
        for start in (0, 2):
            shifted = list(inner)
            shifted[axis] = slice(start, start + n)
            interior &= padded[tuple(shifted)]
    surface: np.ndarray = mask & ~interior
    return surface


def _tree(points: np.ndarray) -> cKDTree:
    return cKDTree(points, leafsize=16, balanced_tree=False, compact_nodes=False)


def surface_distances(
    pred: np.ndarray, target: np.ndarray, spacing: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Directed surface distances between two non-empty boolean masks of one shape.

    The surface of a mask is the mask minus its erosion by a connectivity-1 cross, with
    everything outside the image counted as background (medpy's ``connectivity=1``).
    Both masks are cropped to the bounding box of their union first, which changes no
    distance: outside that box both masks are background. Each direction is then one
    exact Euclidean nearest-surface search: a k-d tree query of the surface points when
    the surfaces are sparse in the box, else one distance transform per surface
    (``scipy.ndimage.distance_transform_edt``, as medpy). Both give the same distances.

    Parameters
    ----------
    pred, target
        Boolean masks, each with at least one ``True`` element.
    spacing
        Physical size of one element along each axis; ``None`` measures in elements.

    Returns
    -------
    tuple of numpy.ndarray
        Distances from every surface element of ``pred`` (in C order) to the nearest
        surface element of ``target``, and from every surface element of ``target`` to
        that of ``pred``.
    """
    box = _bounding_box(pred | target)
    pred_surface, target_surface = _surface(pred[box]), _surface(target[box])
    points = np.count_nonzero(pred_surface) + np.count_nonzero(target_surface)
    if points < _TREE_FRACTION.get(pred.ndim, 0.1) * pred_surface.size:
        scale = np.asarray(1.0 if spacing is None else spacing, dtype=np.float64)
        pred_points = np.argwhere(pred_surface) * scale
        target_points = np.argwhere(target_surface) * scale
        return (
            _tree(target_points).query(pred_points)[0],
            _tree(pred_points).query(target_points)[0],
        )
    to_target = ndimage.distance_transform_edt(~target_surface, sampling=spacing)
    to_pred = ndimage.distance_transform_edt(~pred_surface, sampling=spacing)
    return to_target[pred_surface], to_pred[target_surface]
