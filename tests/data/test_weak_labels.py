"""Weak-label synthesis on random phantoms: placement, coverage, sparsity order, determinism."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from conftest import phantom
from fedseg.data.manifest import IGNORE_INDEX
from fedseg.data.weak import (
    WeakLabelParams,
    boxes_of,
    max_inscribed_rect,
    weak_label,
)
from fedseg.errors import DataError

P = WeakLabelParams()
PIXEL_TYPES = ("point", "scribble", "block")
phantoms = st.builds(
    phantom,
    seed=st.integers(0, 10_000),
    size=st.sampled_from([40, 48, 64]),
    nested=st.booleans(),
)
FAST = settings(max_examples=30, deadline=None)


def labeled(label: np.ndarray) -> int:
    return int((label != IGNORE_INDEX).sum())


@FAST
@given(mask=phantoms, seed=st.integers(0, 1000))
def test_point_scribble_block_labels_lie_inside_their_class(mask: np.ndarray, seed: int) -> None:
    for annotation in PIXEL_TYPES:
        label = weak_label(mask, annotation, np.random.default_rng(seed))
        for c in np.unique(label[label != IGNORE_INDEX]):
            outside = (label == c) & (mask != c)
            assert not outside.any(), f"{annotation}: class {c} labeled outside its region"


@FAST
@given(mask=phantoms, seed=st.integers(0, 1000))
def test_every_present_class_gets_labels(mask: np.ndarray, seed: int) -> None:
    for annotation in (*PIXEL_TYPES, "scribble2"):
        label = weak_label(mask, annotation, np.random.default_rng(seed))
        for c in np.unique(mask):
            assert (label == c).any(), f"{annotation}: class {c} present but never labeled"


@FAST
@given(mask=phantoms, seed=st.integers(0, 1000))
def test_labeled_fraction_orders_point_scribble_block(mask: np.ndarray, seed: int) -> None:
    counts = [labeled(weak_label(mask, a, np.random.default_rng(seed))) for a in PIXEL_TYPES]
    assert counts[0] < counts[1] < counts[2], dict(zip(PIXEL_TYPES, counts, strict=True))
    assert counts[2] < mask.size  # blocks leave a band unlabeled


@FAST
@given(mask=phantoms, seed=st.integers(0, 1000))
def test_scribble2_stays_within_documented_tolerance(mask: np.ndarray, seed: int) -> None:
    tol = math.ceil(P.elastic_alpha * min(mask.shape) + 0.5)
    label = weak_label(mask, "scribble2", np.random.default_rng(seed))
    square = np.ones((2 * tol + 1, 2 * tol + 1), bool)
    for c in np.unique(label[label != IGNORE_INDEX]):
        near = ndimage.binary_dilation(mask == c, square)
        assert not ((label == c) & ~near).any()


def test_scribble2_is_a_perturbed_scribble() -> None:
    mask = phantom(3, 64, nested=True)
    plain = weak_label(mask, "scribble", np.random.default_rng(0))
    noisy = weak_label(mask, "scribble2", np.random.default_rng(0))
    assert not np.array_equal(plain, noisy)
    assert labeled(noisy) < labeled(plain) * 1.2


@pytest.mark.parametrize("annotation", ["point", "scribble", "scribble2", "block", "box"])
def test_generation_is_deterministic_per_seed(annotation: str) -> None:
    mask = phantom(7, 64, nested=True)
    a = weak_label(mask, annotation, np.random.default_rng(5))
    b = weak_label(mask, annotation, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_random_types_differ_between_seeds() -> None:
    mask = phantom(7, 64, nested=True)
    for annotation in ("point", "scribble2"):
        a = weak_label(mask, annotation, np.random.default_rng(1))
        b = weak_label(mask, annotation, np.random.default_rng(2))
        assert not np.array_equal(a, b), annotation


@FAST
@given(mask=phantoms)
def test_box_to_block_foreground_inside_box_and_background_outside(mask: np.ndarray) -> None:
    label = weak_label(mask, "box", np.random.default_rng(0), box_conversion="block")
    boxes = np.zeros(mask.shape, np.uint8)
    for b in boxes_of(mask, rotated=False):
        x0, y0 = round(b.center[0] - b.size[0] / 2), round(b.center[1] - b.size[1] / 2)
        boxes[y0 : y0 + round(b.size[1]), x0 : x0 + round(b.size[0])] = 1
    assert not ((label > 0) & (label != IGNORE_INDEX) & (boxes == 0)).any()
    assert not ((label == 0) & (boxes == 1)).any()
    assert (label == 0).any() and ((label > 0) & (label != IGNORE_INDEX)).any()


@FAST
@given(
    mask=st.builds(phantom, seed=st.integers(0, 10_000), nested=st.booleans(), single=st.just(True))
)
def test_boxes_of_ellipses_convert_to_labels_inside_objects(mask: np.ndarray) -> None:
    """Shrunk inscribed ellipses of an ellipse's (rotated) box lie inside it (1 px slack)."""
    near = {c: ndimage.binary_dilation(mask == c) for c in (1, 2)}
    for annotation in ("box", "rotated_box"):
        label = weak_label(mask, annotation, np.random.default_rng(0), box_conversion="block")
        for c in (1, 2):
            if c == 2:  # a rim box's ellipse covers the cup hole: only the outer side counts
                near[c] = ndimage.binary_fill_holes(near[c])
            assert not ((label == c) & ~near[c]).any(), annotation


def test_rotated_box_follows_object_orientation() -> None:
    mask = np.zeros((64, 64), np.uint8)
    cv2.ellipse(mask, ((32.0, 32.0), (44.0, 12.0), 45.0), 1, -1)
    (box,) = boxes_of(mask, rotated=True)
    (upright,) = boxes_of(mask, rotated=False)
    assert box.area < 0.6 * upright.area
    assert abs(abs(box.angle) % 90 - 45) < 5


def test_box_to_scribble_labels_cup_rim_and_background() -> None:
    mask = phantom(11, 64, nested=True)
    label = weak_label(mask, "box", np.random.default_rng(0), box_conversion="scribble")
    assert {0, 1, 2} <= set(np.unique(label).tolist())
    assert labeled(label) < labeled(weak_label(mask, "block", np.random.default_rng(0)))


def test_mask_without_foreground_is_labeled_as_background() -> None:
    mask = np.zeros((40, 40), np.uint8)
    for annotation in ("point", "scribble", "scribble2", "block", "box", "rotated_box"):
        label = weak_label(mask, annotation, np.random.default_rng(0))
        assert set(np.unique(label).tolist()) <= {0, IGNORE_INDEX}
        assert (label == 0).any(), annotation


def test_volumes_are_labeled_slice_by_slice() -> None:
    volume = np.stack([phantom(s, 40) for s in range(3)])
    label = weak_label(volume, "block", np.random.default_rng(0))
    assert label.shape == volume.shape
    for k in range(3):
        np.testing.assert_array_equal(
            label[k], weak_label(volume[k], "block", np.random.default_rng(0))
        )


def test_full_is_not_a_weak_label_type() -> None:
    with pytest.raises(DataError, match=r"annotation must be one of"):
        weak_label(np.zeros((8, 8), np.uint8), "full", np.random.default_rng(0))


def _brute_force_area(region: np.ndarray) -> int:
    best = 0
    h, _w = region.shape
    for r0 in range(h):
        for r1 in range(r0, h):
            rows = region[r0 : r1 + 1].all(axis=0)
            run = 0
            for v in rows:
                run = run + 1 if v else 0
                best = max(best, run * (r1 - r0 + 1))
    return best


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_max_inscribed_rect_is_maximal_and_inside(seed: int) -> None:
    region = np.random.default_rng(seed).random((9, 11)) < 0.75
    if not region.any():
        return
    r0, c0, r1, c1 = max_inscribed_rect(region)
    assert region[r0 : r1 + 1, c0 : c1 + 1].all()
    assert (r1 - r0 + 1) * (c1 - c0 + 1) == _brute_force_area(region)


def test_max_inscribed_rect_of_large_region_lies_inside() -> None:
    mask = np.zeros((300, 300), np.uint8)
    cv2.ellipse(mask, ((150.0, 150.0), (250.0, 120.0), 30.0), 1, -1)
    r0, c0, r1, c1 = max_inscribed_rect(mask.astype(bool))
    assert mask[r0 : r1 + 1, c0 : c1 + 1].all()
    assert (r1 - r0 + 1) * (c1 - c0 + 1) > 0.3 * mask.sum()
