"""The annotator rules of docs/weak_labels.md as properties, and the label statistics.

Meaningful region (the threshold the rules and these tests use): an 8-connected region of one
class with at least ``max(4, 0.001 * H * W)`` pixels (``WeakLabelParams.min_region``); 4 px
at 40-64 px images.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from fedseg.data.manifest import IGNORE_INDEX
from fedseg.data.weak import WeakLabelParams, boxes_of, weak_label
from fedseg.data.weak.stats import label_counts, stats_table, synthetic_stats

P = WeakLabelParams()
EXACT = ("point", "scribble", "block")
"""Types whose labelled pixels are always correct."""
FAST = settings(max_examples=30, deadline=None)


def structured(seed: int, size: int) -> np.ndarray:
    """Random scene: 1-3 ellipses of classes 1-2 (later ones on top), the first one often
    with a background hole, so background lies around, between and inside structures."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((size, size), np.uint8)
    for i in range(int(rng.integers(1, 4))):
        center = tuple(float(v) for v in rng.uniform(0.2, 0.8, 2) * size)
        axes = rng.uniform(0.15, 0.45, 2) * size
        angle = float(rng.uniform(0, 180))
        cv2.ellipse(mask, (center, tuple(axes), angle), int(rng.integers(1, 3)), -1)
        if i == 0 and rng.random() < 0.5:
            cv2.ellipse(mask, (center, tuple(axes * 0.45), angle), 0, -1)
    return mask


scenes = st.builds(structured, seed=st.integers(0, 10_000), size=st.sampled_from([40, 64]))


def regions(mask: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Every meaningful region: (class, region mask)."""
    threshold = max(4, round(0.001 * mask.size))
    assert threshold == P.min_region_pixels(mask.shape)
    out = []
    for c in np.unique(mask):
        comps, n = ndimage.label(mask == c, structure=np.ones((3, 3)))
        out += [(int(c), comps == k) for k in range(1, n + 1) if (comps == k).sum() >= threshold]
    return out


@FAST
@given(mask=scenes, seed=st.integers(0, 1000))
def test_every_meaningful_region_of_every_class_gets_labels(mask: np.ndarray, seed: int) -> None:
    for annotation in (*EXACT, "scribble2"):
        label = weak_label(mask, annotation, np.random.default_rng(seed))
        for c, region in regions(mask):
            assert (label[region] == c).any(), f"{annotation}: a region of class {c} unlabeled"


@FAST
@given(mask=scenes, seed=st.integers(0, 1000))
def test_exact_types_label_only_correct_pixels(mask: np.ndarray, seed: int) -> None:
    for annotation in EXACT:
        label = weak_label(mask, annotation, np.random.default_rng(seed))
        on = label != IGNORE_INDEX
        assert np.array_equal(label[on], mask[on]), annotation
        assert label_counts(mask, label, 3).error_rate == 0.0


@FAST
@given(mask=scenes, seed=st.integers(0, 1000))
def test_scribble2_errors_stay_within_the_warp_and_are_counted(mask: np.ndarray, seed: int) -> None:
    label = weak_label(mask, "scribble2", np.random.default_rng(seed))
    tol = math.ceil(P.elastic_alpha * min(mask.shape) + 0.5)
    square = np.ones((2 * tol + 1, 2 * tol + 1), bool)
    wrong = 0
    for c in np.unique(label[label != IGNORE_INDEX]):
        assert not ((label == c) & ~ndimage.binary_dilation(mask == c, square)).any()
        wrong += int(((label == c) & (mask != c)).sum())
    counts = label_counts(mask, label, 3)
    assert counts.error_rate == pytest.approx(wrong / max((label != IGNORE_INDEX).sum(), 1))


def test_background_enclosed_by_a_structure_and_between_structures_is_labelled() -> None:
    """A rim around a background hole, and two structures with a background channel between
    them: the hole and the channel are background regions an annotator marks."""
    mask = np.zeros((64, 64), np.uint8)
    cv2.circle(mask, (20, 32), 14, 1, -1)
    cv2.circle(mask, (20, 32), 6, 0, -1)  # hole inside the structure
    cv2.rectangle(mask, (40, 8), (58, 56), 1, -1)  # second structure, channel at x 35-39
    hole = np.zeros_like(mask, bool)
    cv2.circle(hole.view(np.uint8), (20, 32), 5, 1, -1)
    between = np.zeros_like(hole)
    between[8:57, 35:40] = True
    for annotation in ("point", "scribble", "block"):
        label = weak_label(mask, annotation, np.random.default_rng(0))
        assert (label[hole] == 0).any(), annotation
        assert label_counts(mask, label, 2).bg_near_fraction > 0, annotation
    for annotation in ("scribble", "block"):  # strokes run through the channel too
        label = weak_label(mask, annotation, np.random.default_rng(0))
        assert (label[between] == 0).any(), annotation


def test_points_mark_background_near_the_structures() -> None:
    """Background points are searched inside the grown bounding box of the foreground."""
    mask = np.zeros((64, 64), np.uint8)
    cv2.ellipse(mask, ((32.0, 32.0), (16.0, 10.0), 0.0), 1, -1)
    ys, xs = np.nonzero(mask)
    grow = math.ceil(P.point_bg_margin * max(np.ptp(ys), np.ptp(xs)) + 1)
    near = np.zeros(mask.shape, bool)
    near[ys.min() - grow : ys.max() + grow + 1, xs.min() - grow : xs.max() + grow + 1] = True
    for seed in range(5):
        label = weak_label(mask, "point", np.random.default_rng(seed))
        assert (label == 0).any() and not ((label == 0) & ~near).any()


def test_boxes_are_drawn_per_meaningful_region_only() -> None:
    mask = np.zeros((64, 64), np.uint8)
    cv2.circle(mask, (16, 16), 8, 1, -1)
    cv2.circle(mask, (46, 46), 8, 1, -1)
    mask[60, 2] = 1  # a 1-pixel speck: no annotator boxes it
    assert len(boxes_of(mask, rotated=False, min_pixels=P.min_region_pixels(mask.shape))) == 2
    assert len(boxes_of(mask, rotated=False)) == 3


def test_box_to_block_is_lossy_on_non_convex_objects_and_the_loss_is_reported() -> None:
    mask = np.zeros((64, 64), np.uint8)
    mask[8:56, 8:20] = 1
    mask[44:56, 8:56] = 1  # an L: its box's ellipse covers background
    label = weak_label(mask, "box", np.random.default_rng(0), box_conversion="block")
    counts = label_counts(mask, label, 2)
    wrong_fg = int(((label == 1) & (mask == 0)).sum())
    assert wrong_fg > 0
    assert counts.class_error_rate[1] == pytest.approx(wrong_fg / (label == 1).sum())
    assert counts.error_rate == pytest.approx(
        ((label != IGNORE_INDEX) & (label != mask)).sum() / (label != IGNORE_INDEX).sum()
    )


def test_label_counts_by_hand_and_addition() -> None:
    mask = np.zeros((8, 8), np.uint8)
    mask[2:6, 2:6] = 1  # 16 foreground, 48 background pixels
    label = np.full((8, 8), IGNORE_INDEX, np.uint8)
    label[3, 3] = label[3, 4] = 1  # correct
    label[2, 2] = 0  # wrong: foreground labelled background
    label[0, :4] = 0  # 4 correct background
    c = label_counts(mask, label, 2)
    assert c.class_pixels.tolist() == [48, 16]
    assert c.correct.tolist() == [4, 2] and c.labelled.tolist() == [4, 3]
    assert c.labelled_as.tolist() == [5, 2]
    assert c.error_rate == pytest.approx(1 / 7)
    np.testing.assert_allclose(c.labelled_fraction, [4 / 48, 2 / 16])
    np.testing.assert_allclose(c.class_error_rate, [1 / 5, 0])
    assert c.regions.tolist() == [1, 1] and c.regions_hit.tolist() == [1, 1]
    assert (c.bg_near, c.bg_near_labelled) == (0, 0)  # the box holds only foreground
    both = c + c
    assert both.correct.tolist() == [8, 4] and both.error_rate == pytest.approx(1 / 7)
    with pytest.raises(ValueError, match="one shape"):
        label_counts(mask, label[:4], 2)


def test_synthetic_stats_on_a_task_and_its_table() -> None:
    stats = synthetic_stats("faz", ("point", "block", "box"), size=48, per_site=1, seed=3)
    for a in ("point", "block"):
        assert stats[a].error_rate == 0.0
        assert (stats[a].region_coverage == 1).all()
        assert (stats[a].labelled_fraction > 0).all()
    assert stats["point"].correct.sum() < stats["block"].correct.sum()
    assert stats["point"].class_pixels.sum() == 5 * 48 * 48  # one mask per default site
    table = stats_table({"faz": stats}, {"faz": ("background", "faz")})
    assert table.count("\n| faz |") == 3 and "| faz | block |" in table
