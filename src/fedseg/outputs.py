"""What a caller renders after a run: the Markdown table and the figures.

The engine writes data (``results.json``, ``rounds.jsonl``, ``cases.csv``, checkpoints);
callers (``fedseg run``, ``fedseg flower``, benchmarks) turn them into ``results.md`` and
figures with :func:`write_run_outputs`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fedseg.engine.rundir import RunDir

__all__ = ["write_run_outputs"]

log = logging.getLogger(__name__)


def write_run_outputs(run_dir: Path, results: dict[str, Any]) -> list[Path]:
    """Write ``results.md`` and the figures of the finished run in ``run_dir``:
    ``training_curves.png`` (loss, and validation DSC when evaluated, per site per round)
    and the method's own figures (affinity map, AAW weights) when its rounds record them."""
    from fedseg.reporting.plots import render_run_plots
    from fedseg.reporting.results import site_table

    RunDir(run_dir).write_markdown(site_table(results))
    figures = render_run_plots(Path(run_dir))
    for fig in figures:
        log.info("wrote %s", fig)
    return figures
