"""MetricAccumulator (per-case records, averaging) and mean_over_sites."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import fedseg.metrics.functional as functional
from fedseg.metrics import MetricAccumulator, MetricError, mean_over_sites, region_metrics

FUNDUS = {"cup": [2], "disc": [1, 2]}


def _fundus(shape=(8, 8), disc=(2, 6), cup=(3, 5)) -> np.ndarray:
    m = np.zeros(shape, dtype=np.int64)
    m[disc[0] : disc[1], disc[0] : disc[1]] = 1
    m[cup[0] : cup[1], cup[0] : cup[1]] = 2
    return m


def _batch(*maps: np.ndarray) -> np.ndarray:
    return np.stack(maps)


# case 0 is perfect; case 1 predicts the disc without a cup (a cup miss): cup dsc 1 and 0,
# disc dsc 1 and 1 -> means 0.5 and 1.0; cup hd95 0 and the 8x8 diagonal
TEST_CASE_MEANS = [
    _batch(_fundus(), np.where(_fundus() == 2, 1, _fundus())),
    _batch(_fundus(), _fundus()),
    {"dsc": {"cup": 0.5, "disc": 1.0}, "hd95": {"cup": math.hypot(8, 8) / 2, "disc": 0.0}},
]


@pytest.mark.parametrize(("pred", "target", "expected"), [TEST_CASE_MEANS])
def test_aggregate_is_the_mean_over_cases(pred, target, expected):
    acc = MetricAccumulator(FUNDUS, metrics=["dsc", "hd95"])
    acc.add(pred[:1], target[:1], ids=["a"])
    acc.add(torch.from_numpy(pred[1:]), torch.from_numpy(target[1:]), ids=["b"])
    assert len(acc) == 2
    assert _close(acc.aggregate(), expected)
    records = acc.per_case
    assert [r["index"] for r in records] == [0, 1] and [r["id"] for r in records] == ["a", "b"]
    assert records[1]["empty_prediction"] == ["cup"] and records[1]["empty_target"] == []
    assert records[1]["metrics"]["dsc"] == {"cup": 0.0, "disc": 1.0}
    assert acc.empty_target_counts == {"cup": 0, "disc": 0}
    json.dumps(records)


def _close(got: dict, want: dict) -> bool:
    return all(got[m][r] == pytest.approx(v) for m, row in want.items() for r, v in row.items())


def test_counts_empty_targets_and_resets():
    empty = np.zeros((8, 8), dtype=np.int64)
    acc = MetricAccumulator(FUNDUS)
    acc.add(_batch(empty, _fundus()), _batch(empty, np.where(_fundus() == 2, 1, _fundus())))
    assert acc.empty_target_counts == {"cup": 2, "disc": 1}
    assert acc.per_case[0]["id"] is None
    # both empty counts as perfect; the second case's cup is a false alarm
    assert acc.aggregate()["dsc"] == {"cup": 0.5, "disc": 1.0}
    acc.reset()
    assert len(acc) == 0 and acc.empty_target_counts == {"cup": 0, "disc": 0}
    with pytest.raises(MetricError, match="no cases to aggregate"):
        acc.aggregate()


def test_per_case_spacing_and_channel_axis():
    pred = _batch(_fundus(), np.roll(_fundus(), 1, 0))
    target = _batch(_fundus(), _fundus())
    spacings = [(1.0, 1.0), (2.0, 0.5)]
    acc = MetricAccumulator(FUNDUS)
    acc.add(pred[:, None], torch.from_numpy(target)[:, None], spacing=spacings)
    for i, sp in enumerate(spacings):
        assert acc.per_case[i]["metrics"] == region_metrics(pred[i], target[i], FUNDUS, sp)
    shared = MetricAccumulator(FUNDUS)
    shared.add(pred, target, spacing=(2.0, 0.5))
    assert shared.per_case[1]["metrics"] == acc.per_case[1]["metrics"]


def test_3d_batch_with_channel_axis():
    vol = np.zeros((2, 1, 4, 6, 6), dtype=np.int64)
    vol[:, :, 1:3, 1:5, 1:5] = 1
    acc = MetricAccumulator({"organ": [1]}, metrics=["dsc", "assd"])
    acc.add(vol, vol, spacing=(3.0, 1.0, 1.0))
    assert acc.aggregate() == {"dsc": {"organ": 1.0}, "assd": {"organ": 0.0}}


def test_overlap_only_skips_distance_maps(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("surface distances computed although not requested")

    monkeypatch.setattr(functional, "surface_distances", fail)
    acc = MetricAccumulator(FUNDUS, metrics=["dsc", "recall"])
    acc.add(_batch(np.roll(_fundus(), 1, 1)), _batch(_fundus()))
    assert set(acc.aggregate()) == {"dsc", "recall"}


def test_invalid_batch_records_nothing():
    acc = MetricAccumulator(FUNDUS)
    with pytest.raises(MetricError, match="one value per axis"):
        acc.add(_batch(_fundus(), _fundus()), _batch(_fundus(), _fundus()), [None, (1.0,)])
    assert len(acc) == 0


_B2 = _batch(_fundus(), _fundus())


@pytest.mark.parametrize(
    ("pred", "target", "kwargs", "message"),
    [
        (_B2, _B2[:1], {}, r"same shape, got \(2, 8, 8\) and \(1, 8, 8\)"),
        (_fundus(), _fundus(), {}, r"\[B, \*S\] or \[B, 1, \*S\].*got shape \(8, 8\)"),
        (_B2, _B2, {"ids": ["x"]}, r"one id per case \(2\), got 1"),
        (_B2, _B2, {"spacing": [(1.0, 1.0)] * 3}, r"one per case \(2\), got 3"),
        (_B2.astype(float), _B2, {}, "integer labels"),
    ],
)
def test_add_errors(pred, target, kwargs, message):
    with pytest.raises(MetricError, match=message):
        MetricAccumulator(FUNDUS).add(pred, target, **kwargs)


def test_constructor_errors():
    with pytest.raises(MetricError, match="unknown metric 'dice'"):
        MetricAccumulator(FUNDUS, metrics=["dice"])
    with pytest.raises(MetricError, match="region 'cup'"):
        MetricAccumulator({"cup": [-1]})


SITES = {
    "a": {"dsc": {"cup": 0.8, "disc": 0.9}, "hd95": {"cup": 2.0, "disc": 4.0}},
    "b": {"dsc": {"cup": 0.6, "disc": 0.7}, "hd95": {"cup": 6.0, "disc": 8.0}},
}
TEST_CASE_UNWEIGHTED = [None, {"dsc": {"cup": 0.7, "disc": 0.8}, "hd95": {"cup": 4.0, "disc": 6.0}}]
TEST_CASE_WEIGHTED = [
    {"a": 1, "b": 3},
    {"dsc": {"cup": 0.65, "disc": 0.75}, "hd95": {"cup": 5.0, "disc": 7.0}},
]


@pytest.mark.parametrize(("weights", "expected"), [TEST_CASE_UNWEIGHTED, TEST_CASE_WEIGHTED])
def test_mean_over_sites(weights, expected):
    got = mean_over_sites(SITES, weights)
    assert list(got) == ["dsc", "hd95"]
    assert _close(got, expected)


def test_mean_over_sites_propagates_nan():
    sites = {"a": {"dsc": {"cup": math.nan}}, "b": {"dsc": {"cup": 1.0}}}
    assert math.isnan(mean_over_sites(sites)["dsc"]["cup"])


@pytest.mark.parametrize(
    ("results", "weights", "message"),
    [
        ({}, None, "at least one site"),
        ({**SITES, "c": {"dsc": {"cup": 1.0}}}, None, "site 'c' reports"),
        (SITES, {"a": 1.0}, r"missing \['b'\], unknown \[\]"),
        (SITES, {"a": 1.0, "b": -1.0}, "finite and >= 0"),
        (SITES, {"a": 0, "b": 0}, "not all be zero"),
    ],
)
def test_mean_over_sites_errors(results, weights, message):
    with pytest.raises(MetricError, match=message):
        mean_over_sites(results, weights)
