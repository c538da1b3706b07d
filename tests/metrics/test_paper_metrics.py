"""The virtual-class paper's Table I metrics: mIoU (Jaccard averaged over the foreground
regions) and HD (Hausdorff, the maximum surface distance), per site and averaged over sites,
cross-checked against medpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from medpy.metric import binary as mb
from scipy import ndimage

from fedseg.metrics import (
    MetricAccumulator,
    MetricError,
    mean_over_regions,
    mean_over_sites,
    region_metrics,
)

FUNDUS = {"disc": [1, 2], "cup": [2]}


def _fundus_case(rng: np.random.Generator, shape=(40, 44)) -> np.ndarray:
    """0 background, 1 rim, 2 cup: a smooth blob (disc) with a smaller blob inside (cup)."""
    while True:
        field = ndimage.gaussian_filter(rng.random(shape), rng.uniform(2.0, 4.0))
        disc = field > np.quantile(field, rng.uniform(0.6, 0.8))
        cup = disc & (field > np.quantile(field, rng.uniform(0.85, 0.95)))
        if cup.any():
            return disc.astype(np.int64) + cup


def test_hd_is_the_maximum_not_the_95th_percentile():
    pred = np.zeros((9, 12), np.int64)
    target = np.zeros((9, 12), np.int64)
    target[2:6, 2:6] = 1
    pred[2:6, 2:6] = 1
    pred[4, 10] = 1  # one stray pixel 5 columns away from the target block's right edge
    got = region_metrics(pred, target, {"fg": [1]})
    assert got["hd"]["fg"] == pytest.approx(5.0)
    assert got["hd"]["fg"] == pytest.approx(mb.hd(pred, target))
    assert got["hd95"]["fg"] < got["hd"]["fg"]


def test_miou_and_hd_per_site_and_average_match_medpy():
    rng = np.random.default_rng(3)
    sites = {s: [(_fundus_case(rng), _fundus_case(rng)) for _ in range(4)] for s in "AB"}
    per_site = {}
    for site, cases in sites.items():
        acc = MetricAccumulator(FUNDUS, metrics=["jaccard", "hd"])
        for pred, target in cases:
            acc.add(pred[None], target[None])
        per_site[site] = mean_over_regions(acc.aggregate(), ["disc", "cup"])
        want_iou, want_hd = [], []
        for pred, target in cases:
            masks = [(np.isin(pred, c), np.isin(target, c)) for c in FUNDUS.values()]
            want_iou.append(np.mean([mb.jc(p, t) for p, t in masks]))
            want_hd.append(np.mean([mb.hd(p, t) for p, t in masks]))
        assert per_site[site]["jaccard"] == pytest.approx(np.mean(want_iou), rel=1e-12)
        assert per_site[site]["hd"] == pytest.approx(np.mean(want_hd), rel=1e-12)
    # the table's "Avg." column is the plain mean of the site columns
    results = {s: {m: {"all": v} for m, v in r.items()} for s, r in per_site.items()}
    avg = mean_over_regions(mean_over_sites(results))
    for m in ("jaccard", "hd"):
        assert avg[m] == pytest.approx((per_site["A"][m] + per_site["B"][m]) / 2)


def test_region_mean_selects_regions_and_names_missing_ones():
    result = {
        "jaccard": {"disc": 0.9, "cup": 0.7, "rim": 0.1},
        "hd": {"disc": 2.0, "cup": 4.0, "rim": 9.0},
    }
    assert mean_over_regions(result, ["disc", "cup"]) == pytest.approx({"jaccard": 0.8, "hd": 3.0})
    assert mean_over_regions(result)["jaccard"] == pytest.approx(1.7 / 3)
    assert math.isnan(mean_over_regions({"hd": {"a": float("nan"), "b": 1.0}})["hd"])
    with pytest.raises(MetricError, match=r"'jaccard' has no regions \['bg'\]"):
        mean_over_regions(result, ["bg"])
    with pytest.raises(MetricError, match="at least one region"):
        mean_over_regions(result, [])
    with pytest.raises(MetricError, match="at least one metric"):
        mean_over_regions({})
