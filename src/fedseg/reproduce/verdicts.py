"""A paper table's statistics: rows over seeds, every row against the reference rows, and a
verdict per claim (docs/reproduce.md#reading-a-verdict).

Verdicts: ``holds`` (Holm-adjusted Wilcoxon p < ALPHA in the claimed direction; for a closeness
claim: the 95 % interval of the median difference inside the margin), ``contradicted``
(significant the other way; the interval outside the margin), ``unresolved`` (neither),
``refused`` (the rows ran on different data, budgets or seeds), ``not run`` and ``not testable
at this size`` (a row's mechanism was measured inert at the evidence size: its comparisons are
shown, no verdict is drawn from them; :mod:`fedseg.reproduce.protocol`). Holm's family is
every comparison the whole table plans, a comparison not run yet counting as p = 1, so a
verdict reached on rows that have all their seeds stands whatever the rest of the table gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedseg.reporting.stats import (
    HIGHER_IS_BETTER,
    CaseKey,
    Comparison,
    SeedSummary,
    case_values,
    holm,
    paired,
    seed_mean,
    seed_summary,
)
from fedseg.reproduce.papers import AVERAGES, Claim, PaperTable
from fedseg.reproduce.protocol import NOT_TESTABLE

__all__ = [
    "COMPARED_SETTINGS",
    "ClaimVerdict",
    "RowRuns",
    "TableAnalysis",
    "analyse",
    "config_difference",
    "setting_difference",
]

COMPARED_SETTINGS = (
    "data.root",
    "data.synth",
    "eval.split",
    "train.rounds",
    "train.local_epochs",
    "train.local_iters",
)
"""Settings two rows must share for their cases to be compared (the data and the budget)."""


@dataclass
class RowRuns:
    """The finished runs of one row: resolved configs, results and cases.csv, one per seed."""

    label: str
    configs: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    cases: list[Path] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        """The seeds the row ran."""
        return sorted(int(c.get("seed", 0)) for c in self.configs)


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def setting_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """The first of :data:`COMPARED_SETTINGS` in which the resolved configs ``a`` and ``b``
    differ, with both values (None if they share the data and the budget)."""
    for key in COMPARED_SETTINGS:
        va, vb = _get(a, key), _get(b, key)
        if va != vb:
            return key, va, vb
    return None


def config_difference(a: RowRuns, b: RowRuns) -> str | None:
    """Why the cases of ``a`` and ``b`` cannot be compared (None if they can)."""
    if a.seeds != b.seeds:
        return f"{a.label!r} ran seeds {a.seeds}, {b.label!r} seeds {b.seeds}"
    if diff := setting_difference(a.configs[0], b.configs[0]):
        key, va, vb = diff
        return f"{key} differs: {a.label!r} ran {va!r}, {b.label!r} ran {vb!r}"
    return None


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim, its comparisons and its verdict."""

    claim: Claim
    comparisons: tuple[Comparison, ...]
    verdict: str
    reason: str = ""


@dataclass
class TableAnalysis:
    """Rows over seeds, rows against the references, claims with verdicts."""

    summaries: dict[tuple[str, str], SeedSummary]
    references: list[Comparison]
    claims: list[ClaimVerdict]
    cases: dict[tuple[str, str], dict[CaseKey, float]]
    """Per (row, metric): each test case's value, averaged over regions and seeds."""


def _site_average(results: Mapping[str, Any], metric: str, average: str) -> float:
    per_region = results[AVERAGES[average]].get(metric) or {}
    values = [math.nan if v is None else float(v) for v in per_region.values()]
    scale = 100.0 if metric in HIGHER_IS_BETTER else 1.0
    return scale * sum(values) / len(values) if values else math.nan


def _claim_verdict(claim: Claim, comps: Sequence[Comparison]) -> ClaimVerdict:
    refused = [c for c in comps if c.refused]
    if refused:
        return ClaimVerdict(claim, tuple(comps), "refused", refused[0].refused or "")
    if claim.kind == "better":
        each = [c.better() for c in comps]
        each = ["holds" if v == "better" else "contradicted" if v == "worse" else v for v in each]
    else:
        each = [c.close(float(claim.within or 0)) for c in comps]
    if all(v == "holds" for v in each):
        verdict = "holds"
    elif "contradicted" in each:
        verdict = "contradicted"
    else:
        verdict = "unresolved"
    pairs = min((c.stats.pairs for c in comps if c.stats), default=0)
    return ClaimVerdict(claim, tuple(comps), verdict, f"{pairs} pairs")


def _planned(table: PaperTable, metrics: Sequence[str]) -> set[tuple[str, str, str]]:
    """Every comparison of the complete table: each row against each reference row on every
    metric, and each claim's pairs on its metric (a pair and its reverse counted once)."""
    labels = [r.label for r in table.rows]
    wanted = [(r, ref, m) for ref in table.reference for r in labels if r != ref for m in metrics]
    wanted += [(a, b, claim.metric) for claim in table.claims for a, b in claim.pairs()]
    planned: set[tuple[str, str, str]] = set()
    for a, b, m in wanted:
        if (b, a, m) not in planned:
            planned.add((a, b, m))
    return planned


def analyse(
    table: PaperTable,
    runs: Mapping[str, RowRuns],
    metrics: Sequence[str],
    seeds: int | None = None,
    inert: Mapping[str, str] | None = None,
    average: str = "sites",
) -> TableAnalysis:
    """Statistics of one table from the rows' finished runs (rows without runs are skipped).

    A row is *complete* with ``seeds`` seeds (default: the most any row has). Holm's family is
    the complete table's comparisons (:func:`_planned`); for a comparison of two complete rows
    every other comparison counts at p = 1 until both its rows are complete, so its adjusted p
    only falls as the table fills and a verdict on complete rows is final. A claim with a row
    not run (or short of seeds) is ``contradicted`` if its pairs of complete rows already
    contradict it (every pair must hold), else ``not run``, naming the rows it waits for and
    keeping the comparisons run so far (their Holm p counts the rest at p = 1). A claim on a
    row of ``inert`` (label -> the measurement that found its mechanism inert) is
    ``not testable at this size``, whatever its comparisons give. A row's cells average the
    sites as the paper does (``average``: :data:`~fedseg.reproduce.papers.AVERAGES`)."""
    summaries = {
        (label, m): seed_summary([_site_average(r, m, average) for r in rr.results])
        for label, rr in runs.items()
        for m in metrics
    }
    cases = {
        (label, m): seed_mean([case_values(p, m) for p in rr.cases], f"row {label!r}")
        for label, rr in runs.items()
        for m in metrics
    }

    computed: dict[tuple[str, str, str], Comparison] = {}

    def compare(a: str, b: str, metric: str) -> Comparison:
        if (b, a, metric) in computed:
            return computed[(b, a, metric)].reversed()
        if (a, b, metric) not in computed:
            why = config_difference(runs[a], runs[b])
            stats = None if why else paired(cases[(a, metric)], cases[(b, metric)], f"{a} - {b}")
            computed[(a, b, metric)] = Comparison(a, b, metric, stats, refused=why)
        return computed[(a, b, metric)]

    planned = _planned(table, metrics)
    full = seeds or max((len(rr.seeds) for rr in runs.values()), default=0)
    complete = {label for label, rr in runs.items() if len(rr.seeds) >= full}
    for a, b, m in sorted(planned):
        if a in runs and b in runs:
            compare(a, b, m)
    tested = [k for k, c in computed.items() if c.stats is not None]
    final = [k for k in tested if k[0] in complete and k[1] in complete]
    for family in (tested, final):  # complete pairs: the rest at p = 1, a bound that stands
        p = [computed[k].stats.p for k in family] + [1.0] * (len(planned) - len(family))
        for key, adjusted in zip(family, holm(p)[: len(family)], strict=True):
            computed[key] = replace(computed[key], p_holm=adjusted)

    references = [
        compare(r, ref, m)
        for ref in table.reference
        if ref in runs
        for r in runs
        if r != ref
        for m in metrics
    ]
    verdicts = [_verdict(claim, runs, complete, compare) for claim in table.claims]
    verdicts = [_untestable(v, inert or {}) for v in verdicts]
    return TableAnalysis(summaries, references, verdicts, cases)


def _verdict(
    claim: Claim,
    runs: Mapping[str, RowRuns],
    complete: set[str],
    compare: Callable[[str, str, str], Comparison],
) -> ClaimVerdict:
    """The claim's verdict from the pairs run so far (see :func:`analyse`)."""
    pairs = claim.pairs()
    waiting = [(a, b) for a, b in pairs if a not in complete or b not in complete]
    if not waiting:
        return _claim_verdict(claim, [compare(a, b, claim.metric) for a, b in pairs])
    ready = [compare(a, b, claim.metric) for a, b in pairs if (a, b) not in waiting]
    early = _claim_verdict(claim, ready) if ready else None
    if early is not None and early.verdict == "contradicted":
        rest = ", ".join(f"{a} vs {b}" for a, b in waiting)
        return replace(early, reason=f"{early.reason}; still to run: {rest}")
    short = sorted({x for pair in waiting for x in pair if x not in complete})
    missing = [x for x in short if x not in runs]
    partial = [f"{x} (ran seeds {runs[x].seeds})" for x in short if x in runs]
    reasons = [f"no runs of {', '.join(missing)}"] if missing else []
    reasons += [f"short of seeds: {', '.join(partial)}"] if partial else []
    so_far = tuple(compare(a, b, claim.metric) for a, b in pairs if a in runs and b in runs)
    return ClaimVerdict(claim, so_far, "not run", "; ".join(reasons))


def _untestable(v: ClaimVerdict, inert: Mapping[str, str]) -> ClaimVerdict:
    """``v`` as ``not testable at this size`` where one of its rows is measured inert."""
    rows = [r for r in (*v.claim.rows, *v.claim.others) if r in inert]
    if not rows:
        return v
    why = "; ".join(f"{r}: {inert[r]}" for r in dict.fromkeys(rows))
    return replace(v, verdict=NOT_TESTABLE, reason=why)
