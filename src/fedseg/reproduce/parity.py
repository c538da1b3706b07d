"""The authors'-code rows of an evidence page: each claim read again with the rows that a
parity run (the authors' own code on the same federation, docs/evidence/parity/) has in
place of fedseg's runs of those rows; the other rows stay fedseg's.

A table names its parity arms in its paper yaml (``parity: {runs: <folder under
docs/evidence>, rows: {<row label>: <arm folder>}}``). An arm's seed run is used where the
fedseg row has a run of the same seed and the two share the budget (:data:`BUDGET_KEYS`);
for the comparisons it takes the fedseg run's config, so that two rows compare as the table's
rows do.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fedseg.reporting.runs import read_results
from fedseg.reproduce.papers import Parity
from fedseg.reproduce.rows import Reproduction
from fedseg.reproduce.verdicts import ClaimVerdict, RowRuns, analyse

__all__ = ["BUDGET_KEYS", "authors_claims", "authors_runs", "parity_lines"]

BUDGET_KEYS = ("rounds", "local_iters", "local_epochs", "batch_size", "lr")
"""``train`` settings an arm's run must share with the fedseg run it stands in for (a key
the arm's config does not record is not compared)."""


def _seed(run: Path) -> int | None:
    name = run.name
    return int(name[4:]) if name.startswith("seed") and name[4:].isdigit() else None


def _same_budget(arm: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    return all(arm[k] == ours.get(k) for k in BUDGET_KEYS if k in arm)


def authors_runs(
    parity: Parity, runs: Mapping[str, RowRuns], evidence_root: Path
) -> dict[str, RowRuns]:
    """Per parity row with matching runs, the authors' arm as that row's runs."""
    out: dict[str, RowRuns] = {}
    for label, arm in parity.rows.items():
        ours = runs.get(label)
        if ours is None:
            continue
        by_seed = {int(c.get("seed", 0)): c for c in ours.configs}
        found = RowRuns(label)
        for run in sorted((evidence_root / parity.runs / arm).glob("seed*")):
            seed, cases = _seed(run), run / "cases.csv"
            if seed not in by_seed or not cases.is_file() or not (run / "config.yaml").is_file():
                continue
            train = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("train") or {}
            if not _same_budget(train, by_seed[seed].get("train") or {}):
                continue
            found.configs.append(by_seed[seed])
            found.results.append(read_results(run / "results.json"))
            found.cases.append(cases)
        if found.cases:
            out[label] = found
    return out


def authors_claims(rep: Reproduction) -> tuple[list[ClaimVerdict], dict[str, RowRuns]]:
    """The table's claims that involve a row with authors'-code runs, with their verdicts on
    those runs (fedseg's for the other rows), and the substituted rows."""
    parity, a = rep.table.parity, rep.analysis
    if parity is None or rep.evidence is None or a is None:
        return [], {}
    runs = {r.row.label: r.runs() for r in rep.rows}
    theirs = authors_runs(parity, runs, rep.evidence.parent)
    if not theirs:
        return [], {}
    mixed = analyse(
        rep.table, {**runs, **theirs}, rep.paper.metrics, seeds=rep.seeds, average=rep.paper.average
    )
    return [v for v in mixed.claims if {*v.claim.rows, *v.claim.others} & set(theirs)], theirs


def parity_lines(rep: Reproduction) -> list[str]:
    """The page's section on the claims read with the authors' code."""
    verdicts, theirs = authors_claims(rep)
    if not verdicts:
        return []
    ours = {v.claim.id: v.verdict for v in rep.analysis.claims} if rep.analysis else {}
    arms = ", ".join(f"{label} ({len(rr.cases)} seeds)" for label, rr in sorted(theirs.items()))
    lines = [
        "",
        "### The claims with the authors' code",
        "",
        f"The same claims, with the authors' own code in place of fedseg's runs of {arms} "
        f"(the parity runs of [docs/evidence/parity](../parity/README.md), same federation, "
        "seeds and budget, the last round's model; the other rows are fedseg's), tested as "
        "above.",
        "",
        "| claim | pairs | median difference | verdict with the authors' code | fedseg's verdict |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        pairs = "; ".join(f"{c.row} − {c.other}" for c in v.comparisons) or "—"
        medians = (
            "; ".join(f"{c.stats.median:+.2f}" if c.stats else "—" for c in v.comparisons) or "—"
        )
        verdict = f"**{v.verdict}**" + (f" ({v.reason})" if v.verdict != "holds" else "")
        lines.append(
            f"| {v.claim.id} | {pairs} | {medians} | {verdict} | {ours.get(v.claim.id, '—')} |"
        )
    return lines
