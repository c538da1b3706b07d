"""Equivalence of two arms run on the same test cases (reference parity, issue 47).

An arm is a list of run folders, one per seed. Each case's value is its mean over regions,
then over the arm's seeds (:mod:`fedseg.reporting.stats`); the statistic is the median of
the paired differences (arm minus reference) with its bootstrap 95 % interval. The margin
is ``max(floor, sd)``, ``sd`` the sample SD over the reference arm's seeds of its average
(the mean over sites). The rule is stated in docs/evidence/parity/README.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedseg.errors import ConfigError
from fedseg.reporting.runs import read_results
from fedseg.reporting.stats import Paired, case_values, paired, seed_mean

__all__ = ["Equivalence", "Verdict", "arm_average", "compare_arms", "margin", "verdict"]

Verdict = Literal["equivalent", "different", "not shown equivalent"]


@dataclass(frozen=True)
class Equivalence:
    """One arm against a reference arm: the paired statistic, the margin and the verdict."""

    paired: Paired
    margin: float
    verdict: Verdict
    seeds: tuple[int, int]
    """Seed runs of the arm and of the reference."""


def arm_average(runs: Sequence[Path], metric: str = "dsc") -> list[float]:
    """Each run's average over sites of ``metric`` (mean over regions), in points for the
    overlaps."""
    out = []
    for run in runs:
        avg = read_results(run / "results.json").get("average", {}).get(metric)
        if not isinstance(avg, dict) or not avg:
            raise ConfigError(f"{run / 'results.json'}: no average {metric!r}")
        scale = 1.0 if metric.startswith("hd") or metric == "assd" else 100.0
        out.append(scale * statistics.fmean(float(v) for v in avg.values()))
    return out


def margin(reference_averages: Sequence[float], floor: float = 2.0) -> float:
    """``max(floor, sd)``: the stated margin, widened to the reference's seed-to-seed SD."""
    if len(reference_averages) < 2:
        return floor
    return max(floor, statistics.stdev(reference_averages))


def verdict(p: Paired, m: float) -> Verdict:
    """``equivalent`` when the interval lies inside (-m, m); ``different`` when it lies
    wholly outside [-m, m], or excludes 0 and reaches past a bound; else ``not shown
    equivalent``."""
    if p.pairs == 0:
        return "not shown equivalent"
    if -m < p.low and p.high < m:
        return "equivalent"
    outside = p.low > m or p.high < -m
    past_bound = p.low <= -m or p.high >= m
    if outside or ((p.low > 0 or p.high < 0) and past_bound):
        return "different"
    return "not shown equivalent"


def compare_arms(
    arm: Sequence[Path],
    reference: Sequence[Path],
    metric: str = "dsc",
    floor: float = 2.0,
    what: str = "arm",
) -> Equivalence:
    """``arm`` minus ``reference`` (run folders, one per seed) on their common test cases."""
    if not arm or not reference:
        raise ConfigError(f"{what}: both arms need at least one run")
    a = seed_mean([case_values(r / "cases.csv", metric) for r in arm], what)
    b = seed_mean([case_values(r / "cases.csv", metric) for r in reference], f"{what} reference")
    p = paired(a, b, what)
    m = margin(arm_average(reference, metric), floor)
    return Equivalence(p, m, verdict(p, m), (len(arm), len(reference)))
