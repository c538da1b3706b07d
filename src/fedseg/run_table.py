"""How a run's per-site numbers print: the metric format and the table that ``fedseg run``,
``fedseg demo`` and ``fedseg flower local/server`` show at the end of a run."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

__all__ = ["DISTANCES", "fmt", "results_table"]

DISTANCES = ("hd95", "hd", "assd")
"""Metrics in pixels or millimetres (printed as is, not as percent)."""


def fmt(value: float, metric: str) -> str:
    """Percent for overlap metrics, two decimals for distances."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}" if metric not in DISTANCES else f"{value:.2f}"


def results_table(results: dict[str, Any]) -> Table:
    """DSC (%) and HD95 per site and region, as in the papers' tables."""
    regions = list(results["average"]["dsc"])
    table = Table(title=f"{results['method']} ({results['labels']} labels)")
    table.add_column("site")
    table.add_column("n", justify="right")
    for m in ("DSC", "HD95"):
        for r in regions:
            table.add_column(f"{m} {r}", justify="right")
    rows = [(s, str(results["cases"][s]), v) for s, v in results["sites"].items()]
    rows.append(("Average", "", results["average"]))
    for name, n, v in rows:
        cells = [fmt(v[m][r], m) for m in ("dsc", "hd95") for r in regions]
        table.add_row(name, n, *cells, style="bold" if name == "Average" else None)
    return table
