"""Per-case metrics: hand-computed cases, the empty policy, and agreement with medpy."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis.extra.numpy import arrays
from medpy.metric import binary as mb
from scipy import ndimage

from fedseg.metrics import (
    DEFINITIONS,
    EMPTY_POLICY,
    METRICS,
    MetricError,
    case_metrics,
    region_metrics,
)


def _mask(shape: tuple[int, ...], *points: tuple[int, ...]) -> np.ndarray:
    m = np.zeros(shape, dtype=np.int64)
    for p in points:
        m[p] = 1
    return m


def _block(shape: tuple[int, ...], *slices: slice) -> np.ndarray:
    m = np.zeros(shape, dtype=np.int64)
    m[slices] = 1
    return m


def _one(pred: np.ndarray, target: np.ndarray, spacing=None) -> dict[str, float]:
    out = region_metrics(pred, target, {"fg": [1]}, spacing)
    return {m: v["fg"] for m, v in out.items()}


# pred 2x3 block over a 2x2 target block: the extra column is 1 pixel from the target, so
# the pooled distances are eight 0s and two 1s.
TEST_CASE_BLOCKS = [
    _block((5, 5), slice(1, 3), slice(1, 4)),
    _block((5, 5), slice(1, 3), slice(1, 3)),
    None,
    {
        "dsc": 0.8,
        "jaccard": 4 / 6,
        "precision": 4 / 6,
        "recall": 1.0,
        "hd95": 1.0,
        "assd": 0.2,
        "hd": 1.0,
    },
]
TEST_CASE_BLOCKS_SPACING = [
    *TEST_CASE_BLOCKS[:2],
    (2.0, 0.5),
    {**TEST_CASE_BLOCKS[3], "hd95": 0.5, "assd": 0.1, "hd": 0.5},
]
# single pixels at (0, 0) and (3, 4): every distance is 5 (sqrt(9 + 64) with spacing 1 x 2)
TEST_CASE_POINTS = [
    _mask((5, 6), (3, 4)),
    _mask((5, 6), (0, 0)),
    None,
    {
        "dsc": 0.0,
        "jaccard": 0.0,
        "precision": 0.0,
        "recall": 0.0,
        "hd95": 5.0,
        "assd": 5.0,
        "hd": 5.0,
    },
]
TEST_CASE_POINTS_SPACING = [
    *TEST_CASE_POINTS[:2],
    (1.0, 2.0),
    {**TEST_CASE_POINTS[3], "hd95": math.sqrt(73), "assd": math.sqrt(73), "hd": math.sqrt(73)},
]
TEST_CASE_3D = [
    _mask((3, 3, 3), (1, 2, 2)),
    _mask((3, 3, 3), (0, 0, 0)),
    (2.0, 1.0, 1.0),
    {"dsc": 0.0, "jaccard": 0.0, "precision": 0.0, "recall": 0.0}
    | {"hd95": math.sqrt(12), "assd": math.sqrt(12), "hd": math.sqrt(12)},
]
TEST_CASE_IDENTICAL = [
    _block((6, 6), slice(0, 4), slice(2, 6)),
    _block((6, 6), slice(0, 4), slice(2, 6)),
    None,
    {
        "dsc": 1.0,
        "jaccard": 1.0,
        "precision": 1.0,
        "recall": 1.0,
        "hd95": 0.0,
        "assd": 0.0,
        "hd": 0.0,
    },
]
# one pixel 3 columns right of a 3x3 block whose surface is its 8 outer pixels: the pooled
# ASSD (9 distances) differs from the mean of the two directed means (medpy < 0.5.2)
_FAR = [3.0, math.sqrt(26), math.sqrt(17), math.sqrt(10), 5.0, 3.0]
_FAR += [math.sqrt(26), math.sqrt(17), math.sqrt(10)]
TEST_CASE_ASYMMETRIC = [
    _mask((7, 7), (1, 5)),
    _block((7, 7), slice(0, 3), slice(0, 3)),
    None,
    {"dsc": 0.0, "jaccard": 0.0, "precision": 0.0, "recall": 0.0}
    | {"hd95": math.sqrt(26), "assd": sum(_FAR) / 9, "hd": math.sqrt(26)},
]


@pytest.mark.parametrize(
    ("pred", "target", "spacing", "expected"),
    [
        TEST_CASE_BLOCKS,
        TEST_CASE_BLOCKS_SPACING,
        TEST_CASE_POINTS,
        TEST_CASE_POINTS_SPACING,
        TEST_CASE_3D,
        TEST_CASE_IDENTICAL,
        TEST_CASE_ASYMMETRIC,
    ],
)
def test_hand_computed(pred, target, spacing, expected):
    got = _one(pred, target, spacing)
    assert list(got) == list(METRICS)
    for m, v in expected.items():
        assert got[m] == pytest.approx(v, abs=1e-12), m


def test_assd_is_pooled_not_mean_of_directed_means():
    pred, target = TEST_CASE_ASYMMETRIC[:2]
    mean_of_means = (3.0 + sum(_FAR[1:]) / 8) / 2
    assert _one(pred, target)["assd"] != pytest.approx(mean_of_means)


# empty policy: both empty, a complete miss and a false alarm; diagonal of a 4x6 image is
# sqrt(52) pixels, 10 with spacing (2, 1), and 7 for a 2x3x6 volume
_TARGET = _block((4, 6), slice(1, 3), slice(1, 3))
_EMPTY = np.zeros((4, 6), dtype=np.int64)
TEST_CASE_BOTH_EMPTY = ["both_empty", _EMPTY, _EMPTY, None, 0.0]
TEST_CASE_MISS = ["empty_prediction", _EMPTY, _TARGET, None, math.sqrt(52)]
TEST_CASE_MISS_SPACING = ["empty_prediction", _EMPTY, _TARGET, (2.0, 1.0), 10.0]
TEST_CASE_FALSE_ALARM = ["empty_target", _TARGET, _EMPTY, (2.0, 1.0), 10.0]
TEST_CASE_MISS_3D = [
    "empty_prediction",
    np.zeros((2, 3, 6), dtype=np.int64),
    _mask((2, 3, 6), (1, 1, 1)),
    None,
    7.0,
]


@pytest.mark.parametrize(
    ("case", "pred", "target", "spacing", "distance"),
    [
        TEST_CASE_BOTH_EMPTY,
        TEST_CASE_MISS,
        TEST_CASE_MISS_SPACING,
        TEST_CASE_FALSE_ALARM,
        TEST_CASE_MISS_3D,
    ],
)
def test_empty_policy(case, pred, target, spacing, distance):
    got = _one(pred, target, spacing)
    for m in METRICS:
        rule = EMPTY_POLICY[case][m]
        assert got[m] == (distance if rule == "diagonal" else rule), m
    assert got["hd95"] == got["assd"] == got["hd"] == distance


def test_policy_never_rewards_a_mismatch():
    for case in ("empty_prediction", "empty_target"):
        rule = EMPTY_POLICY[case]
        assert all(rule[m] == 0.0 for m in ("dsc", "jaccard", "precision", "recall"))
        assert rule["hd95"] == rule["assd"] == rule["hd"] == "diagonal"
    json.dumps({"empty_policy": EMPTY_POLICY, "definitions": DEFINITIONS})


def test_editing_public_policy_does_not_change_results():
    EMPTY_POLICY["empty_prediction"]["dsc"] = 1.0
    try:
        assert _one(_EMPTY, _TARGET)["dsc"] == 0.0
    finally:
        EMPTY_POLICY["empty_prediction"]["dsc"] = 0.0


def _blob(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A random multi-component mask, often touching the image border."""
    while True:
        m = ndimage.gaussian_filter(rng.random(shape), rng.uniform(1.0, 3.0)) > rng.uniform(
            0.45, 0.55
        )
        if m.any():
            return m


def _medpy(pred: np.ndarray, target: np.ndarray, spacing) -> dict[str, float]:
    return {
        "dsc": mb.dc(pred, target),
        "hd95": mb.hd95(pred, target, voxelspacing=spacing),
        "assd": mb.assd(pred, target, voxelspacing=spacing),
        "jaccard": mb.jc(pred, target),
        "precision": mb.precision(pred, target),
        "recall": mb.recall(pred, target),
        "hd": mb.hd(pred, target, voxelspacing=spacing),
    }


@pytest.mark.parametrize("shape", [(48, 40), (14, 18, 16)])
@pytest.mark.parametrize("with_spacing", [False, True])
def test_matches_medpy_on_random_masks(shape, with_spacing):
    rng = np.random.default_rng(len(shape) * 10 + with_spacing)
    for _ in range(8):
        pred, target = _blob(rng, shape), _blob(rng, shape)
        spacing = tuple(rng.uniform(0.3, 3.0, len(shape))) if with_spacing else None
        got = _one(pred.astype(np.uint8), target.astype(np.uint8), spacing)
        want = _medpy(pred, target, spacing)
        for m in METRICS:
            assert got[m] == pytest.approx(want[m], rel=1e-12, abs=1e-12), m


def test_case_metrics_matches_medpy_per_class():
    rng = np.random.default_rng(7)
    shape = (40, 36)
    target = _blob(rng, shape).astype(np.int64) + _blob(rng, shape) * 2  # labels 0..3
    pred = _blob(rng, shape).astype(np.int64) + _blob(rng, shape) * 2
    got = case_metrics(pred, target, 4, spacing=(0.5, 1.5))
    assert set(got) == set(METRICS) and all(list(v) == [1, 2, 3] for v in got.values())
    for c in (1, 2, 3):
        p, t = pred == c, target == c
        if not (p.any() and t.any()):
            continue
        for m, v in _medpy(p, t, (0.5, 1.5)).items():
            assert got[m][c] == pytest.approx(v, rel=1e-12, abs=1e-12), (m, c)


def test_fundus_regions_are_unions_of_classes():
    rng = np.random.default_rng(3)
    shape = (32, 32)
    target = _blob(rng, shape).astype(np.int64) + _blob(rng, shape)  # 0 bg, 1 rim, 2 cup
    pred = _blob(rng, shape).astype(np.int64) + _blob(rng, shape)
    got = region_metrics(pred, target, {"cup": [2], "disc": [1, 2]})
    for region, p, t in (("cup", pred == 2, target == 2), ("disc", pred > 0, target > 0)):
        for m, v in _medpy(p, t, None).items():
            assert got[m][region] == pytest.approx(v, rel=1e-12, abs=1e-12), (m, region)


def test_torch_and_numpy_inputs_agree():
    rng = np.random.default_rng(5)
    pred = rng.integers(0, 3, (20, 20))
    target = rng.integers(0, 3, (20, 20))
    assert case_metrics(torch.from_numpy(pred), torch.from_numpy(target), 3) == case_metrics(
        pred, target, 3
    )


def test_metric_subset():
    got = case_metrics(_TARGET, _TARGET, 2, metrics=["hd95", "dsc"])
    assert got == {"hd95": {1: 0.0}, "dsc": {1: 1.0}}


@settings(max_examples=60, deadline=None, database=None)
@given(
    arrays(np.bool_, (9, 11)),
    arrays(np.bool_, (9, 11)),
)
def test_swapping_inputs_swaps_precision_and_recall(pred, target):
    a, b = _one(pred.astype(int), target.astype(int)), _one(target.astype(int), pred.astype(int))
    assert a["precision"] == b["recall"] and a["recall"] == b["precision"]
    for m in ("dsc", "jaccard", "hd95", "assd", "hd"):
        assert a[m] == pytest.approx(b[m]), m
    assert all(0.0 <= a[m] <= 1.0 for m in ("dsc", "jaccard", "precision", "recall"))
    assert a["hd"] >= a["hd95"] >= 0.0 and a["hd"] >= a["assd"] >= 0.0
    if pred.any() and target.any():  # never as bad as a miss, which scores the diagonal
        assert a["hd"] < math.hypot(9, 11)


def test_speed_64x64_three_classes():
    rng = np.random.default_rng(0)
    target = _blob(rng, (64, 64)).astype(np.int64) + _blob(rng, (64, 64))
    pred = np.roll(target, 2, axis=0)
    case_metrics(pred, target, 3)
    best = min(_timed(lambda: case_metrics(pred, target, 3)) for _ in range(20))
    assert best < 5e-3


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


_GOOD = np.zeros((4, 4), dtype=np.int64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pred": np.zeros((4, 5), int)}, r"same shape, got \(4, 5\) and \(4, 4\)"),
        ({"pred": np.zeros(4, int), "target": np.zeros(4, int)}, "2D or 3D"),
        ({"pred": np.zeros((4, 4))}, "integer labels, got dtype float64"),
        ({"target": np.full((4, 4), 3)}, r"target labels must lie in \[0, 3\)"),
        ({"num_classes": 1}, "num_classes must be an int >= 2"),
        ({"spacing": (1.0,)}, "one value per axis"),
        ({"spacing": (1.0, -1.0)}, "positive finite"),
        ({"metrics": ["hd99"]}, "unknown metric 'hd99'.*hd95"),
        ({"metrics": []}, "at least one"),
    ],
)
def test_case_metrics_errors(kwargs, message):
    args = {"pred": _GOOD, "target": _GOOD, "num_classes": 3} | kwargs
    with pytest.raises(MetricError, match=message):
        case_metrics(**args)


@pytest.mark.parametrize(
    ("regions", "message"),
    [({}, "at least one region"), ({"cup": "2"}, "sequence"), ({"cup": []}, "one or more")],
)
def test_region_errors(regions, message):
    with pytest.raises(MetricError, match=message):
        region_metrics(_GOOD, _GOOD, regions)
