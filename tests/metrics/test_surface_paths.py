"""Surface distances: both search paths (k-d tree, distance transform) equal medpy."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from medpy.metric import binary as mb
from scipy import ndimage

from fedseg.metrics import METRICS, region_metrics, surface
from fedseg.metrics.surface import _surface

MEDPY = {
    "dsc": mb.dc,
    "jaccard": mb.jc,
    "precision": mb.precision,
    "recall": mb.recall,
    "hd95": mb.hd95,
    "assd": mb.assd,
    "hd": mb.hd,
}
DISTANCES = ("hd95", "assd", "hd")
# 0: always distance transforms; inf: always k-d tree queries; None: the size-based choice
PATHS = {"edt": 0.0, "tree": float("inf"), "auto": None}


def _pair(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    mask = arrays(np.bool_, shape).filter(lambda m: m.any())
    return st.tuples(mask, mask)


def _check(pred: np.ndarray, target: np.ndarray, spacing, path: str) -> None:
    fraction = PATHS[path]
    table = surface._TREE_FRACTION if fraction is None else dict.fromkeys((2, 3), fraction)
    with mock.patch.object(surface, "_TREE_FRACTION", table):
        got = region_metrics(pred.astype(np.uint8), target.astype(np.uint8), {"r": [1]}, spacing)
    for m in METRICS:
        kw = {"voxelspacing": spacing} if m in DISTANCES else {}
        want = MEDPY[m](pred, target, **kw)
        assert got[m]["r"] == pytest.approx(want, rel=1e-12, abs=1e-12), (m, path)


@pytest.mark.parametrize("path", list(PATHS))
@settings(max_examples=40, deadline=None, database=None)
@given(
    masks=st.sampled_from([(13, 9), (6, 7, 5)]).flatmap(_pair),
    anisotropic=st.booleans(),
    data=st.data(),
)
def test_random_masks_equal_medpy(path, masks, anisotropic, data):
    pred, target = masks
    spacing = None
    if anisotropic:
        step = st.floats(0.25, 4.0, allow_nan=False)
        spacing = tuple(data.draw(st.tuples(*[step] * pred.ndim)))
    _check(pred, target, spacing, path)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("shape", [(96, 80), (24, 20, 28)])
def test_smooth_masks_equal_medpy(path, shape):
    rng = np.random.default_rng(len(shape))
    for _ in range(3):
        pred, target = (
            ndimage.gaussian_filter(rng.random(shape), 3) > rng.uniform(0.48, 0.52)
            for _ in range(2)
        )
        if pred.any() and target.any():
            _check(pred, target, tuple(rng.uniform(0.5, 2.0, len(shape))), path)


@settings(max_examples=60, deadline=None, database=None)
@given(st.sampled_from([(7, 8), (4, 5, 6)]).flatmap(lambda s: arrays(np.bool_, s)))
def test_surface_is_mask_minus_cross_erosion(mask):
    cross = ndimage.generate_binary_structure(mask.ndim, 1)
    want = mask & ~ndimage.binary_erosion(mask, structure=cross, border_value=0)
    np.testing.assert_array_equal(_surface(mask), want)
