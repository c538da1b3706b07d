"""Equivalence of two arms (reference parity): the margin, the verdict and the pairing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedseg.errors import ConfigError
from fedseg.reporting.equivalence import compare_arms, margin, verdict
from fedseg.reporting.stats import Paired


def _run(root: Path, dsc: dict[tuple[str, str], float]) -> Path:
    """A run folder with per-case DSC (fractions) and the matching per-site averages."""
    root.mkdir(parents=True)
    lines = ["site,case,id,region,metric,value"]
    for i, ((site, cid), v) in enumerate(sorted(dsc.items())):
        lines.append(f"{site},{i},{cid},faz,dsc,{v!r}")
    (root / "cases.csv").write_text("\n".join(lines) + "\n")
    sites = sorted({s for s, _ in dsc})
    per_site = {s: float(np.mean([v for (t, _), v in dsc.items() if t == s])) for s in sites}
    results = {
        "sites": {s: {"dsc": {"faz": v}} for s, v in per_site.items()},
        "average": {"dsc": {"faz": float(np.mean(list(per_site.values())))}},
    }
    (root / "results.json").write_text(json.dumps(results))
    return root


def _cases(values: np.ndarray) -> dict[tuple[str, str], float]:
    return {("AB"[i % 2], f"c{i}"): float(v) for i, v in enumerate(values)}


def _paired(low: float, high: float, pairs: int = 30) -> Paired:
    return Paired(pairs, 0, (low + high) / 2, low, high, 0.5, 0)


def test_margin_is_the_floor_or_the_reference_seed_sd() -> None:
    assert margin([80.0, 80.5, 81.0]) == 2.0
    assert margin([70.0, 80.0, 90.0]) == pytest.approx(10.0)
    assert margin([75.0]) == 2.0


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (-1.0, 1.5, "equivalent"),
        (-2.5, 1.0, "not shown equivalent"),  # reaches past -m but includes 0
        (0.5, 2.5, "different"),  # excludes 0 and reaches past m
        (-6.0, -3.0, "different"),  # wholly outside
        (-2.0, 1.0, "not shown equivalent"),  # touching the bound is not inside
    ],
)
def test_verdict_reads_the_interval_against_the_margin(low, high, expected) -> None:
    assert verdict(_paired(low, high), 2.0) == expected


def test_identical_arms_are_equivalent_and_a_shifted_arm_is_different(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(0.6, 0.9, size=40)
    reference = [_run(tmp_path / f"ref{s}", _cases(base + 0.005 * s)) for s in range(3)]
    same = [_run(tmp_path / f"same{s}", _cases(base + 0.005 * s + 0.002)) for s in range(3)]
    worse = [_run(tmp_path / f"worse{s}", _cases(base - 0.08)) for s in range(3)]

    eq = compare_arms(same, reference)
    assert eq.verdict == "equivalent"
    assert eq.paired.pairs == 40
    assert eq.paired.median == pytest.approx(0.2, abs=1e-9)  # points, seed means per case
    assert eq.margin == 2.0  # the reference's seed SD (0.5 points) is below the floor
    assert eq.seeds == (3, 3)

    diff = compare_arms(worse, reference)
    assert diff.verdict == "different"
    assert diff.paired.high < -2.0


def test_arms_on_other_cases_are_refused(tmp_path: Path) -> None:
    a = [_run(tmp_path / "a", {("A", "c1"): 0.8, ("A", "c2"): 0.7})]
    b = [_run(tmp_path / "b", {("A", "c1"): 0.8, ("A", "c3"): 0.7})]
    with pytest.raises(ConfigError, match="different cases"):
        compare_arms(a, b, what="FedAvg")
    with pytest.raises(ConfigError, match="at least one run"):
        compare_arms([], b)
