"""What ``fedseg run`` and ``fedseg demo`` share: train one config into a run directory
under a progress bar, then write its table, figures and models, and show its results."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.logging import RichHandler
from torch import nn

from fedseg.config import RunConfig
from fedseg.console import console, err, progress
from fedseg.errors import FedsegError
from fedseg.run_table import results_table

__all__ = ["print_results", "train"]


def _logging(run_dir: Path, verbose: bool, quiet: bool) -> None:
    """Log into ``run_dir/run.log`` and to the terminal (warnings only when ``quiet``)."""
    rich_handler = RichHandler(console=err, show_path=False, show_time=False)
    rich_handler.setFormatter(logging.Formatter("%(message)s"))
    if quiet and not verbose:
        rich_handler.setLevel(logging.WARNING)
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(run_dir / "run.log")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        handlers=[rich_handler, fh],
        force=True,
    )


def _save_models(run_dir: Path, built: Mapping[str, nn.Module]) -> None:
    """Export the run's evaluation models into ``RUN/models`` (a failure is reported, the
    finished run stays); ``built``: the models the final evaluation built, used as they are
    (a site without one is built again from the checkpoint)."""
    from fedseg.export import export_run
    from fedseg.inference import RunModels

    try:
        written = export_run(RunModels(run_dir, built=built), run_dir / "models")
    except FedsegError as e:
        logging.getLogger("fedseg").warning("models not exported: %s", e.reason)
        return
    logging.getLogger("fedseg").info("exported %d models to %s", len(written), run_dir / "models")


def train(
    cfg: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
    quiet: bool = False,
    label: str | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` into ``run_dir`` (a new run, or continue it with ``resume``) under a
    progress bar labelled ``label`` (default: the method); write ``results.md``, the figures
    and (``eval.save_models``) ``models/``; return ``results.json``'s content. ``quiet``
    shows only warnings in the terminal (``run.log`` has everything)."""
    from fedseg.engine.rundir import RunDir
    from fedseg.engine.runner import InProcessRunner
    from fedseg.outputs import write_run_outputs

    rd = RunDir(run_dir)
    with rd.lock():
        if not resume:
            rd.prepare_new(overwrite)
        _logging(run_dir, verbose, quiet)
        runner = InProcessRunner(cfg, run_dir, keep_eval_models=cfg.eval.save_models)
        with progress(f"{label or cfg.method_name} rounds", cfg.train.rounds) as update:
            results = runner.run(resume=resume, on_round=lambda rec: update(rec["round"] + 1))
        write_run_outputs(run_dir, results)
        if cfg.eval.save_models:
            _save_models(run_dir, runner.eval_models)
    return results


def print_results(results: dict[str, Any], run_dir: Path) -> None:
    """The per-site table, the parameter counts and where the run's files are."""
    p = results["params"]
    console.print(results_table(results))
    console.print(
        f"params: total {p['total']:,}, upload {p['upload']:,}, download {p['download']:,}",
        highlight=False,
    )
    console.print(
        f"all metrics: {Path(run_dir) / 'results.md'} (per case: cases.csv; figures, models/ "
        "and the config beside it)",
        highlight=False,
        soft_wrap=True,
    )
