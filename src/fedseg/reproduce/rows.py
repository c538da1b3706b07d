"""A reproduced table in memory: each row's finished runs, the budget, the statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedseg.reproduce.papers import Paper, PaperRow, PaperTable
from fedseg.reproduce.protocol import Measurement, inert_labels, measure
from fedseg.reproduce.verdicts import RowRuns, TableAnalysis

__all__ = ["Reproduction", "RowResult"]


@dataclass
class RowResult:
    """A row's runs (one per seed), where their files are, and their wall and CPU time."""

    row: PaperRow
    results: list[dict[str, Any]] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Wall seconds of the row's runs (training rounds and the final evaluation)."""
        return sum(_seconds(r, "") for r in self.results)

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the row's runs (this process's, training and final evaluation)."""
        return sum(_seconds(r, "cpu_") for r in self.results)

    def runs(self) -> RowRuns:
        """The row's finished runs for the statistics."""
        return RowRuns(
            self.row.label, self.configs, self.results, [d / "cases.csv" for d in self.dirs]
        )


def _seconds(results: dict[str, Any], kind: str) -> float:
    timing = results.get("timing") or {}
    return float(sum(timing.get(f"round_{kind}seconds", []))) + float(
        timing.get(f"eval_{kind}seconds", 0.0)
    )


@dataclass
class Reproduction:
    """A paper table run at one budget."""

    paper: Paper
    table: PaperTable
    budget: str
    overrides: dict[str, Any]
    """The budget's overrides, then the caller's ``--set`` items (what the rows ran with)."""
    seeds: int
    rows: list[RowResult]
    out: Path
    analysis: TableAnalysis | None = None
    evidence: Path | None = None
    planned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The resolved config (seed 0) at this budget of each row a check of the config alone
    measures (:data:`~.protocol.FROM_CONFIG`), so that a row not run is measured too."""

    def measurements(self) -> dict[str, dict[str, Measurement]]:
        """Per mechanism check of the table: each of its rows' measurement from the kept runs
        (or, for a measurement of the config alone, from the planned config)."""
        found = {r.row.label: (r.dirs, r.configs) for r in self.rows}
        return {m.id: measure(m, found, self.planned) for m in self.table.mechanisms}

    def inert(self) -> dict[str, str]:
        """The rows whose mechanism is measured inert, each with its measurement."""
        return inert_labels(self.table.mechanisms, self.measurements().values())
