"""Figures a run directory gets at the end, chosen by what its ``rounds.jsonl`` records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fedseg.reporting.affinity import last_affinity, plot_affinity
from fedseg.reporting.weights_plot import plot_weights

__all__ = ["PLOTS", "affinity_table", "render_run_plots"]

PLOTS: dict[str, Callable[[Path], Path]] = {
    "affinity": plot_affinity,
    "aaw_weights": lambda run: plot_weights(run, run / "aaw_weights.png"),
}
"""Server metric recorded per round -> function drawing it into the run directory."""


def render_run_plots(run_dir: Path) -> list[Path]:
    """Draw every figure whose server metric appears in ``run_dir/rounds.jsonl``."""
    path = Path(run_dir) / "rounds.jsonl"
    keys: set[str] = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                keys |= set(json.loads(line).get("server") or {})
    return [draw(Path(run_dir)) for key, draw in PLOTS.items() if key in keys]


def affinity_table(run_dir: Path) -> str:
    """The last recorded affinity matrix of a run as a Markdown table."""
    rnd, matrix, names = last_affinity(run_dir)
    head = "| | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1)
    rows = [
        f"| {n} | " + " | ".join(f"{v:.2f}" for v in row) + " |"
        for n, row in zip(names, matrix, strict=True)
    ]
    return f"Prompt affinity after round {rnd + 1}:\n\n{head}\n" + "\n".join(rows) + "\n"
