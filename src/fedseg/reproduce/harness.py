"""Run the rows of a paper table at a budget and render them beside the published numbers.

A *budget* is a set of config overrides stated here once (``BUDGETS``; ``paper`` takes each
paper's own ``paper_budget``): ``smoke`` proves that every row runs (2 rounds of 4 steps of
batch 2 on 32-pixel synthetic data; the number of images is kept, as the smallest sites need
a validation and a test case), ``cpu`` runs the shipped configs as they are (the CPU-scale
settings each config documents), ``paper`` moves towards the paper's scale. A budget that
changes the synthetic data also moves ``data.root`` to ``<root>-<budget>`` so federations of
different sizes never share a folder. Finished runs with an identical config are reused.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import apply_overrides, dump_config, parse_config
from fedseg.configs import resolve_config
from fedseg.errors import ConfigError
from fedseg.reproduce.papers import Paper, PaperRow, PaperTable, load_paper

__all__ = [
    "BUDGETS",
    "Reproduction",
    "RowResult",
    "apply_budget",
    "budget_overrides",
    "compare_methods",
    "render_csv",
    "render_markdown",
    "reproduce",
    "run_config",
]

BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "train.rounds": 2,
        "train.local_iters": 4,
        "data.synth.size": 32,
        "train.batch_size": 2,
    },
    "cpu": {},
}
"""Overrides per budget; ``paper`` is each paper's ``paper_budget`` (fedseg/papers/*.yaml)."""

BUDGET_NAMES = ("smoke", "cpu", "paper")


def budget_overrides(budget: str, paper: Paper) -> dict[str, Any]:
    """The overrides of ``budget`` for ``paper``."""
    if budget == "paper":
        return dict(paper.paper_budget)
    if budget not in BUDGETS:
        raise ConfigError(f"--budget {budget!r}: expected one of {', '.join(BUDGET_NAMES)}")
    return dict(BUDGETS[budget])


def apply_budget(
    raw: dict[str, Any], budget: str, overrides: dict[str, Any], then: Sequence[str] = ()
) -> dict[str, Any]:
    """``raw`` with the budget's overrides, then the ``key=value`` items ``then``:
    ``train.local_iters`` replaces ``local_epochs``; ``data.synth.*`` applies only to
    synthetic federations and renames ``data.root`` (after ``then``) to ``<root>-<budget>``."""
    raw = copy.deepcopy(raw)
    synth = (raw.get("data") or {}).get("synth")
    items = []
    for key, value in overrides.items():
        if key.startswith("data.synth.") and not synth:
            continue
        if key == "train.local_iters":
            (raw.get("train") or {}).pop("local_epochs", None)
        items.append(f"{key}={json.dumps(value)}")
    raw = apply_overrides(raw, [*items, *then])
    if any(k.startswith("data.synth.") for k in overrides) and synth:
        raw["data"]["root"] = f"{raw['data']['root']}-{budget}"
    return raw


def run_config(raw: dict[str, Any], run_dir: Path, source: str = "<config>") -> dict[str, Any]:
    """Run ``raw`` in-process into ``run_dir`` (results.md and figures included) and return
    its results; a finished run there with the identical config is reused."""
    from fedseg.engine.rundir import RunDir
    from fedseg.engine.runner import InProcessRunner
    from fedseg.outputs import write_run_outputs

    cfg = parse_config(raw, source)
    rd = RunDir(run_dir)
    finished = rd.results_json.is_file() and rd.config.is_file()
    if finished and rd.config.read_text() == dump_config(cfg):
        return json.loads(rd.results_json.read_text())
    rd.prepare_new(overwrite=True)
    results = InProcessRunner(cfg, run_dir).run()
    write_run_outputs(run_dir, results)
    return results


@dataclass
class RowResult:
    """A row's runs (one per seed) and their wall time."""

    row: PaperRow
    results: list[dict[str, Any]] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    def stat(self, metric: str) -> tuple[float, float | None]:
        """Mean over seeds of the metric's average over sites and regions, and the sample
        standard deviation over seeds (None for one seed)."""
        values = [_average(r, metric) for r in self.results]
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


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


def _average(results: dict[str, Any], metric: str) -> float:
    per_region = results["average"].get(metric)
    if not per_region:
        return math.nan
    values = [math.nan if v is None else float(v) for v in per_region.values()]
    return statistics.fmean(values)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "row"


def _select(table: PaperTable, rows: Sequence[str] | None) -> list[PaperRow]:
    if not rows:
        return list(table.rows)
    chosen = []
    for key in rows:
        found = [
            r
            for i, r in enumerate(table.rows, 1)
            if key == str(i) or key.lower() == r.label.lower()
        ]
        if not found:
            labels = ", ".join(f"{i}: {r.label}" for i, r in enumerate(table.rows, 1))
            raise ConfigError(f"--row {key!r}: no such row in {table.name} ({labels})")
        chosen += found
    return chosen


def reproduce(
    paper: str,
    table: str,
    budget: str = "smoke",
    out: Path | None = None,
    seeds: int = 1,
    overrides: Sequence[str] = (),
    rows: Sequence[str] | None = None,
    on_run: Callable[[str, dict[str, Any], float], None] | None = None,
) -> Reproduction:
    """Run the rows of ``paper``'s ``table`` (all, or those named in ``rows`` by label or
    1-based index) ``seeds`` times each at ``budget``; ``overrides`` (``key=value``) come
    last. Writes ``OUT/<row>/seed<k>`` run directories and ``OUT/table.md`` / ``table.csv``.
    ``on_run(name, results, seconds)`` is called after each run."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be at least 1")
    p = load_paper(paper)
    t = p.table(table)
    budget_set = budget_overrides(budget, p)
    out = out or Path("runs") / "reproduce" / f"{paper}-{table}-{budget}"
    done = []
    for row in _select(t, rows):
        path = resolve_config(row.config)
        base = yaml.safe_load(path.read_text()) or {}
        raw = apply_overrides(base, list(row.overrides))
        raw = apply_budget(raw, budget, budget_set, then=overrides)
        result = RowResult(row)
        for k in range(seeds):
            run_raw = copy.deepcopy(raw)
            run_raw["seed"] = int(raw.get("seed", 0)) + k
            run_dir = out / _slug(row.label) / f"seed{run_raw['seed']}"
            t0 = time.perf_counter()
            res = run_config(run_raw, run_dir, str(path))
            seconds = time.perf_counter() - t0
            result.results.append(res)
            result.dirs.append(run_dir)
            result.seconds += seconds
            if on_run:
                on_run(f"{row.label} (seed {run_raw['seed']})", res, seconds)
        done.append(result)
    stated = {**budget_set, **dict(item.split("=", 1) for item in overrides)}
    rep = Reproduction(p, t, budget, stated, seeds, done, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(render_markdown(rep))
    (out / "table.csv").write_text(render_csv(rep))
    return rep


def _ours(rr: RowResult, metric: str) -> str:
    from fedseg.reporting.results import fmt

    mean, std = rr.stat(metric)
    return fmt(mean, metric) if std is None else f"{fmt(mean, metric)} ± {fmt(std, metric)}"


def _published(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def render_markdown(rep: Reproduction) -> str:
    """The table: our metrics (mean ± std over seeds) beside the paper's published columns."""
    from fedseg.reporting.results import METRIC_LABELS

    t = rep.table
    budget = ", ".join(f"{k}={v}" for k, v in rep.overrides.items()) or "shipped configs"
    head = (
        ["row"]
        + [f"ours {METRIC_LABELS.get(m, m)}" for m in rep.paper.metrics]
        + [f"paper {c}" for c in t.columns]
        + ["seconds"]
    )
    lines = [
        f"## {rep.paper.title}: {t.title}",
        "",
        f"Budget `{rep.budget}` ({budget}); {rep.seeds} seed(s) per row; published numbers: "
        f"{t.source}. Ours: averages over sites and regions on synthetic federations, so "
        "only the ordering of rows is comparable with the paper.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for rr in rep.rows:
        published = rr.row.published or (None,) * len(t.columns)
        cells = (
            [rr.row.label]
            + [_ours(rr, m) for m in rep.paper.metrics]
            + [_published(v) for v in published]
            + [f"{rr.seconds:.0f}"]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(rep: Reproduction) -> str:
    """One line per row: our means and standard deviations, the published values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    metrics = rep.paper.metrics
    w.writerow(
        ["row", "config", "seeds"]
        + [f"{m}{s}" for m in metrics for s in ("", "_std")]
        + [f"paper {c}" for c in rep.table.columns]
        + ["seconds"]
    )
    for rr in rep.rows:
        stats = [rr.stat(m) for m in metrics]
        published = rr.row.published or (None,) * len(rep.table.columns)
        w.writerow(
            [rr.row.label, rr.row.config, len(rr.results)]
            + [x for mean, std in stats for x in (mean, "" if std is None else std)]
            + ["" if v is None else v for v in published]
            + [round(rr.seconds, 1)]
        )
    return buf.getvalue()


def compare_methods(
    config: Path, runs: Sequence[str], out: Path, overrides: Sequence[str] = ()
) -> Path:
    """Run several ``method:labels`` variants (labels: weak | full) of one base config and
    write ``OUT/report.md`` with the comparison table and the wall times. Method settings
    come from the base config's ``method_settings.<method>`` block, if any."""
    from fedseg.reporting.compare import comparison_table

    base = yaml.safe_load(config.read_text()) or {}
    settings = base.pop("method_settings", {}) or {}
    base = apply_overrides(base, list(overrides))
    results, times = [], []
    for item in runs:
        method, _, labels = item.partition(":")
        raw = copy.deepcopy(base)
        raw["method"] = {"name": method, **settings.get(method, {})}
        raw["data"]["labels"] = labels or "weak"
        raw["name"] = f"{method}-{raw['data']['labels']}"
        t0 = time.perf_counter()
        results.append(run_config(raw, out / raw["name"], str(config)))
        times.append((raw["name"], time.perf_counter() - t0))
    lines = [comparison_table(results), "## Wall time", "", "| run | seconds |", "|---|---|"]
    lines += [f"| {n} | {t:.0f} |" for n, t in times]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report
