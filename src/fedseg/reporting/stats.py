"""Paired statistics over test cases: per-case values, seed means, Wilcoxon, Holm, bootstrap.

Each run writes ``cases.csv`` (one value per site, case, region and metric). A row's value of
a case is its mean over regions, then its mean over the row's seeds, so that two rows are
compared on independent pairs: the same test case of the same site. Overlaps are in percentage
points (the papers' unit), distances as written.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as sps

from fedseg.engine.rundir import CASES_COLUMNS
from fedseg.errors import ConfigError
from fedseg.reporting.runs import read_results

__all__ = [
    "ALPHA",
    "HIGHER_IS_BETTER",
    "CaseKey",
    "Comparison",
    "Paired",
    "SeedSummary",
    "case_values",
    "holm",
    "paired",
    "read_cases",
    "seed_mean",
    "seed_summary",
]

ALPHA = 0.05
"""Significance level of every test (after Holm's correction within one table)."""

HIGHER_IS_BETTER = {"dsc": True, "jaccard": True, "precision": True, "recall": True}
"""Metrics where larger is better; the distances (hd95, hd, assd) are smaller-is-better."""

CaseKey = tuple[str, str]
"""(site, case id): what pairs two rows."""


def _scale(metric: str) -> float:
    return 100.0 if metric in HIGHER_IS_BETTER else 1.0


def read_cases(path: Path) -> list[tuple[str, str, str, str, float]]:
    """``(site, case id, region, metric, value)`` per line of a run's ``cases.csv`` (NaN
    where a value is undefined). ConfigError naming ``path`` (and the line) where the file
    is cut off, a line is damaged or a value is no number, a case lacks some of the
    region-metric values the others have, or a site has fewer cases than the run's
    ``results.json`` beside it counts."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read per-case metrics ({e})") from None
    if not text.endswith("\n"):
        raise ConfigError(f"{path}: cut off (its last line has no line end); run it again")
    reader = csv.reader(io.StringIO(text))
    if tuple(next(reader, ())) != CASES_COLUMNS:
        raise ConfigError(f"{path}:1: expected the header {','.join(CASES_COLUMNS)}")
    out, items = [], defaultdict(set)
    for fields in reader:
        if len(fields) != len(CASES_COLUMNS):
            raise ConfigError(
                f"{path}:{reader.line_num}: expected {len(CASES_COLUMNS)} values, got {len(fields)}"
            )
        site, case, cid, region, metric, v = fields
        try:
            value = math.nan if v in ("", "None") else float(v)
        except ValueError:
            raise ConfigError(f"{path}:{reader.line_num}: value {v!r} is no number") from None
        out.append((site, cid, region, metric, value))
        items[(site, case)].add((region, metric))
    every = set().union(*items.values())
    for (site, case), have in items.items():
        if have != every:
            raise ConfigError(
                f"{path}: site {site!r} case {case} lacks values the other cases have "
                f"(e.g. {min(every - have)}; cut off?)"
            )
    counted = path.with_name("results.json")
    expected = read_results(counted).get("cases") if counted.is_file() else None
    for site, n in (expected or {}).items():
        found = sum(s == site for s, _ in items)
        if found != n:
            raise ConfigError(
                f"{path}: {found} test cases of site {site!r}, {counted.name} counts {n} (cut off?)"
            )
    return out


def case_values(path: Path, metric: str) -> dict[CaseKey, float]:
    """Per test case, the mean over regions of ``metric`` in ``path`` (a run's cases.csv,
    read by :func:`read_cases`), in the papers' units; NaN where a region's value is
    missing."""
    by_case: dict[CaseKey, list[float]] = defaultdict(list)
    for site, cid, _, m, value in read_cases(path):
        if m == metric:
            by_case[(site, cid)].append(value)
    if not by_case:
        raise ConfigError(f"{path}: no values of metric {metric!r}")
    scale = _scale(metric)
    return {k: scale * statistics.fmean(v) for k, v in by_case.items()}


def seed_mean(per_seed: Sequence[Mapping[CaseKey, float]], what: str) -> dict[CaseKey, float]:
    """Each case's mean over seeds; the seeds must cover the same cases (``what`` names the
    row in the error)."""
    keys = set(per_seed[0])
    for i, values in enumerate(per_seed[1:], 1):
        if set(values) != keys:
            diff = sorted(keys ^ set(values))[:3]
            raise ConfigError(f"{what}: seed run {i} has other test cases than run 0 (e.g. {diff})")
    return {k: statistics.fmean(v[k] for v in per_seed) for k in sorted(keys)}


@dataclass(frozen=True)
class SeedSummary:
    """A row's metric over seeds: mean, sample sd and the 95 % t-interval of the mean."""

    mean: float
    sd: float | None
    n: int
    low: float | None
    high: float | None


def seed_summary(values: Sequence[float]) -> SeedSummary:
    """Mean, sample standard deviation and 95 % t-interval of per-seed values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return SeedSummary(mean, None, len(values), None, None)
    sd = statistics.stdev(values)
    half = float(sps.t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))
    return SeedSummary(mean, sd, len(values), mean - half, mean + half)


@dataclass(frozen=True)
class Paired:
    """Row minus other on their common test cases (seed means), in the papers' units."""

    pairs: int
    dropped: int
    """Cases left out because either row has no value there (e.g. an undefined distance)."""
    median: float
    low: float
    high: float
    """The bootstrap 95 % interval of the median difference."""
    p: float
    """Two-sided Wilcoxon signed-rank p-value (1 when every difference is zero)."""
    direction: int
    """+1 when the positive differences outrank the negative ones, -1 the other way, 0 tied."""


def paired(
    row: Mapping[CaseKey, float],
    other: Mapping[CaseKey, float],
    what: str,
    *,
    resamples: int = 4000,
    seed: int = 0,
) -> Paired:
    """Compare two rows case by case; ConfigError naming ``what`` if they ran on other cases."""
    if set(row) != set(other):
        diff = sorted(set(row) ^ set(other))[:3]
        raise ConfigError(f"{what}: the rows were tested on different cases (e.g. {diff})")
    keys = sorted(row)
    d = np.array([row[k] - other[k] for k in keys], dtype=np.float64)
    kept = d[np.isfinite(d)]
    if kept.size == 0:
        return Paired(0, len(keys), math.nan, math.nan, math.nan, 1.0, 0)
    nonzero = kept[kept != 0]
    if nonzero.size == 0:
        p, direction = 1.0, 0
    else:
        p = float(sps.wilcoxon(nonzero).pvalue)
        ranks = sps.rankdata(np.abs(nonzero))
        balance = ranks[nonzero > 0].sum() - ranks[nonzero < 0].sum()
        direction = int(np.sign(balance))
    rng = np.random.default_rng(seed)
    boot = np.median(kept[rng.integers(0, kept.size, (resamples, kept.size))], axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return Paired(
        int(kept.size),
        int(d.size - kept.size),
        float(np.median(kept)),
        float(low),
        float(high),
        p,
        direction,
    )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """``row`` minus ``other`` on ``metric``; ``p_holm`` within the table's family."""

    row: str
    other: str
    metric: str
    stats: Paired | None
    p_holm: float = math.nan
    refused: str | None = None

    def reversed(self) -> Comparison:
        """``other`` minus ``row``."""
        s = self.stats
        if s is not None:
            s = replace(s, median=-s.median, low=-s.high, high=-s.low, direction=-s.direction)
        return replace(self, row=self.other, other=self.row, stats=s)

    def better(self) -> str:
        """``better`` / ``worse`` (significant in the metric's own direction) or ``unresolved``."""
        if self.refused or self.stats is None:
            return "refused"
        sign = 1 if HIGHER_IS_BETTER.get(self.metric, False) else -1
        if self.p_holm < ALPHA and self.stats.direction:
            return "better" if sign * self.stats.direction > 0 else "worse"
        return "unresolved"

    def close(self, margin: float) -> str:
        """``holds`` when the interval lies inside +-margin, ``contradicted`` when outside."""
        if self.refused or self.stats is None:
            return "refused"
        s = self.stats
        if -margin < s.low and s.high < margin:
            return "holds"
        if s.low > margin or s.high < -margin:
            return "contradicted"
        return "unresolved"


def format_p(p: float) -> str:
    """A p-value for a table: two significant digits below 0.001, else three decimals."""
    return "n/a" if math.isnan(p) else (f"{p:.2g}" if p < 0.001 else f"{p:.3f}")
