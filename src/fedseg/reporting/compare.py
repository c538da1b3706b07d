"""One comparison table across runs, laid out like the papers' Tables II-V."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedseg.errors import ConfigError
from fedseg.reporting.results import fmt

__all__ = ["comparison_table", "load_results"]


def load_results(run_dir: Path) -> dict[str, Any]:
    """Read ``results.json`` of a finished run."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no results.json (is the run finished?)")
    return json.loads(path.read_text())


def _label(res: dict[str, Any]) -> str:
    return f"{res['method']} ({res['labels']})"


def comparison_table(
    results: list[dict[str, Any]], metrics: tuple[str, ...] = ("dsc", "hd95")
) -> str:
    """Markdown: one row per run, columns site x region and the average, per metric."""
    sites = list(results[0]["sites"])
    mismatched = [_label(r) for r in results if list(r["sites"]) != sites]
    if mismatched:
        raise ConfigError(f"runs {mismatched} were evaluated on other sites than {sites}")
    regions = list(results[0]["average"][metrics[0]])
    out = []
    for m in metrics:
        cols = [(s, reg) for s in [*sites, "Average"] for reg in regions]
        head = ["Method"] + [f"{s} {reg}" if len(regions) > 1 else s for s, reg in cols]
        out += [f"## {m.upper()}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for res in results:
            vals = [
                fmt((res["average"] if s == "Average" else res["sites"][s])[m][reg], m)
                for s, reg in cols
            ]
            out.append("| " + " | ".join([_label(res), *vals]) + " |")
        out.append("")
    return "\n".join(out)
