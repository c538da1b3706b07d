"""Run the rows of a paper table at a budget and render them beside the published numbers.

A *budget* is a set of config overrides stated here once (``BUDGETS``; ``paper`` takes each
paper's own ``paper_budget``): ``smoke`` proves that every row runs (2 rounds of 4 steps of
batch 2 on 32-pixel synthetic data; the number of images is kept, as the smallest sites need
a validation and a test case), ``cpu`` runs the shipped configs as they are (the CPU-scale
settings each config documents), ``evidence`` the rounds at which the table's control rows
converged (``evidence_budget`` of the paper file, measured by :mod:`fedseg.reproduce.budget`),
``paper`` moves towards the paper's scale. A budget that changes the synthetic data also moves
``data.root`` to ``<root>-<budget>`` so federations of different sizes never share a folder.
Finished runs with the same resolved config are reused, in the output folder or in an evidence
folder (``docs/evidence/<paper>-<table>/runs``: the small files of each finished run,
committed so that a table continues on another machine).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import RunConfig, apply_overrides, parse_config
from fedseg.configs import resolve_config
from fedseg.errors import ConfigError
from fedseg.reporting.runs import read_results
from fedseg.reproduce.evidence import write_index, write_table
from fedseg.reproduce.papers import Paper, PaperRow, PaperTable, load_paper
from fedseg.reproduce.protocol import FROM_CONFIG, inert_labels, measure
from fedseg.reproduce.rows import Reproduction, RowResult
from fedseg.reproduce.runs import (
    Finished,
    Job,
    finished_run,
    keep_run,
    kept_difference,
    require_readable,
    run_config,
    run_jobs,
    stored_config,
)
from fedseg.reproduce.verdicts import analyse, setting_difference

__all__ = [
    "BUDGETS",
    "Reproduction",
    "RowResult",
    "apply_budget",
    "budget_overrides",
    "compare_methods",
    "kept_runs",
    "reproduce",
    "run_config",
]

log = logging.getLogger(__name__)

BUDGETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "train.rounds": 2,
        "train.local_iters": 4,
        "data.synth.size": 32,
        "train.batch_size": 2,
    },
    "cpu": {},
}
"""Overrides per budget; ``evidence`` and ``paper`` come from fedseg/papers/<paper>.yaml."""

BUDGET_NAMES = ("smoke", "cpu", "evidence", "paper")

EVIDENCE_ROOT = Path("docs") / "evidence"
"""Where ``--budget evidence`` keeps each table's page and finished runs by default."""


def budget_overrides(budget: str, paper: Paper, table: PaperTable | None = None) -> dict[str, Any]:
    """The overrides of ``budget`` for ``paper`` (``evidence``: for ``table``'s federation)."""
    if budget == "paper":
        return dict(paper.paper_budget)
    if budget == "evidence":
        fed = table.federation if table else None
        if fed is None or fed not in paper.evidence_budgets:
            what = f"table {table.name!r}" if table else "this table"
            raise ConfigError(
                f"--budget evidence: no evidence budget measured for {what} of {paper.name} "
                f"(federation {fed!r}); measure it with `fedseg reproduce {paper.name} "
                f"{table.name if table else 'TABLE'} --calibrate` (docs/reproduce.md)"
            )
        return dict(paper.evidence_budgets[fed].overrides)
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


def refuse_other_budget(kept: Path, cfg: RunConfig) -> None:
    """ConfigError if ``kept`` holds a finished run of other data or another budget than
    ``cfg`` (:data:`~fedseg.reproduce.verdicts.COMPARED_SETTINGS`): an evidence folder keeps
    one budget, and training ``cfg`` would replace that run, even with ``--rerun``. (A run
    of the same budget under an older default is replaced with ``--rerun`` only: that is how
    a table follows a changed default.)"""
    stored = stored_config(kept)
    if stored is None:
        return
    diff = setting_difference(stored.model_dump(mode="json"), cfg.model_dump(mode="json"))
    if diff:
        key, was, now = diff
        raise ConfigError(
            f"{kept} holds a finished run with {key}={was!r}, this run has {now!r}: an evidence "
            "folder keeps one budget; give other settings their own --evidence DIR (or none)"
        )


ORIGIN_FILE = "origin.txt"
"""Beside a run copied from another table's evidence folder: where it was copied from."""


def reuse_kept_elsewhere(kept: Path, root: Path, paper: str, cfg: RunConfig) -> Path | None:
    """Copy into ``kept`` a finished run of ``cfg`` kept for another table of ``paper`` under
    the evidence ``root`` (``<paper>-<table>/runs/<row>/seed<k>``), so that a row shared by
    several tables (the same resolved config and seed) is trained once. Returns the source,
    or None when there is none. The copy names its source in :data:`ORIGIN_FILE`.
    (Calibration runs never match: they evaluate on the validation split.)"""
    for source in sorted(root.glob(f"{paper}-*/runs/*/{kept.name}")):
        if source.resolve() == kept.resolve():
            continue
        try:
            require_readable(source)
        except ConfigError as e:
            log.warning("not copied: %s", e.reason)
            continue
        if finished_run(source, cfg):
            keep_run(source, kept)
            origin = source.relative_to(root).as_posix()
            (kept / ORIGIN_FILE).write_text(
                f"copied from {origin} (a finished run of the same resolved config)\n"
            )
            return source
    return None


def slug(label: str) -> str:
    """A row label as a folder name."""
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


def row_config(
    row: PaperRow, budget: str, budget_set: dict[str, Any], overrides: Sequence[str]
) -> tuple[dict[str, Any], Path]:
    """A row's raw config at a budget with the caller's overrides, and its config file.
    A row's ``train.local_epochs`` replaces its config's ``local_iters`` (a paper that trains
    an epoch per round)."""
    path = resolve_config(row.config)
    base = yaml.safe_load(path.read_text()) or {}
    if any(item.startswith("train.local_epochs=") for item in row.overrides):
        (base.get("train") or {}).pop("local_iters", None)
    raw = apply_overrides(base, list(row.overrides))
    return apply_budget(raw, budget, budget_set, then=overrides), path


def reproduce(
    paper: str,
    table: str,
    budget: str = "smoke",
    out: Path | None = None,
    seeds: int = 1,
    overrides: Sequence[str] = (),
    rows: Sequence[str] | None = None,
    on_run: Callable[[str, dict[str, Any], float], None] | None = None,
    evidence: Path | None = None,
    command: str | None = None,
    workers: int = 1,
    render_only: bool = False,
    rerun: bool = False,
) -> Reproduction:
    """Run the rows of ``paper``'s ``table`` (all, or those named in ``rows`` by label or
    1-based index) ``seeds`` times each at ``budget``; ``overrides`` (``key=value``) come
    last. Without ``rows``, a row that a check of its config alone finds inert at this budget
    (:func:`planned_inert`) is not trained, with a warning naming the measurement.
    Writes ``OUT/<row>/seed<k>`` run directories and ``OUT/table.md`` / ``table.csv``
    with the statistics and the claims' verdicts. With an ``evidence`` folder (the default
    for ``--budget evidence`` without ``overrides``: docs/evidence/<paper>-<table>, which
    keeps that budget alone: see :func:`refuse_other_budget`) a run whose small files are
    there with the same config counts as done, each new run's small files are copied there
    and the table page is written there too (with ``command``), after every row, so an
    interrupted table has a page of the rows it finished. ``workers`` > 1 runs that many
    runs at once in worker processes (:func:`~fedseg.reproduce.runs.run_jobs`).
    ``on_run(name, results, seconds)`` is called after each run. ``render_only`` trains
    nothing: the evidence page is rendered again from the runs kept there
    (:func:`kept_runs`). A kept run is never replaced unless ``rerun`` (then the chosen
    rows' runs are all trained afresh and their kept files replaced); one that cannot be
    read stops the table before anything trains (:func:`~.runs.require_readable`)."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be at least 1")
    if evidence is not None and evidence.exists() and not evidence.is_dir():
        raise ConfigError(f"--evidence {evidence}: is a file, expected a folder")
    p = load_paper(paper)
    t = p.table(table)
    budget_set = budget_overrides(budget, p, t)
    out = out or Path("runs") / "reproduce" / f"{paper}-{table}-{budget}"
    if evidence is None and budget == "evidence" and not overrides:
        evidence = EVIDENCE_ROOT / f"{paper}-{table}"  # the table's page holds its budget only
    stated = {**budget_set, **dict(item.split("=", 1) for item in overrides)}
    if render_only:
        if evidence is None:
            raise ConfigError("--render-only renders an evidence page: give --budget evidence")
        kept = [r for r in (kept_runs(evidence, row) for row in t.rows) if r is not None]
        planned = planned_configs(t, budget, budget_set, overrides)
        rep = Reproduction(
            p, t, budget, stated, seeds, kept, out, evidence=evidence, planned=planned
        )
        _write_pages(rep, command)
        return rep
    chosen = _select(t, rows)
    planned = planned_configs(t, budget, budget_set, overrides)
    if not rows:  # a row its config alone shows inert here can get no verdict: train it asked
        skipped = planned_inert(t, planned)
        for label, why in skipped.items():
            log.warning("%s: not trained, inert at this budget (%s); --row trains it", label, why)
        chosen = [r for r in chosen if r.label not in skipped]
    done: dict[str, RowResult] = {}
    if evidence is not None:  # every kept run the page reads, before anything trains
        for r in t.rows:
            if not (rerun and r in chosen):
                for name, *_ in _seed_runs(r, budget, budget_set, overrides, seeds):
                    require_readable(evidence / "runs" / name)

    def page() -> Reproduction:
        """The finished rows: the ones run here and, on an evidence page, every other row of
        the table with kept runs (another process may be running them), in table order."""
        found = [done.get(r.label) or kept_result(r) for r in t.rows] if evidence else []
        ordered = [r for r in found if r is not None]
        ordered = ordered or [done[r.label] for r in chosen if r.label in done]
        return Reproduction(
            p, t, budget, stated, seeds, ordered, out, evidence=evidence, planned=planned
        )

    def kept_result(row: PaperRow) -> RowResult | None:
        result = RowResult(row)
        for name, _, cfg, _ in _seed_runs(row, budget, budget_set, overrides, seeds):
            kept = evidence / "runs" / name if evidence else None
            if kept is not None and finished_run(kept, cfg):
                result.results.append(read_results(kept / "results.json"))
                result.dirs.append(kept)
                result.configs.append(cfg.model_dump(mode="json"))
        return result if result.results else None

    jobs: list[Job] = []
    owner: list[tuple[PaperRow, int, RunConfig]] = []  # per job: its row, seed and config
    for row in chosen:
        for name, run_raw, cfg, path in _seed_runs(row, budget, budget_set, overrides, seeds):
            kept = evidence / "runs" / name if evidence else None
            if kept is not None and (rerun or not finished_run(kept, cfg)):
                refuse_other_budget(kept, cfg)
                why = None if rerun else kept_difference(kept, cfg)
                if why:
                    raise ConfigError(
                        f"{kept} holds a finished run with {why}: a kept run is not replaced "
                        "unasked; pass --rerun (with --row) to train it again and replace it"
                    )
                if not rerun:
                    reuse_kept_elsewhere(kept, evidence.parent, paper, cfg)
            jobs.append(Job(run_raw, path, out / name, kept, rerun))
            owner.append((row, int(run_raw["seed"]), cfg))
    finished: dict[int, Finished] = {}
    for f in run_jobs(jobs, workers):
        finished[f.index] = f
        row, seed, _ = owner[f.index]
        if on_run:
            on_run(f"{row.label} (seed {seed})", f.results, f.seconds)
        mine = [i for i, (r, _, _) in enumerate(owner) if r is row]
        if all(i in finished for i in mine):
            result = RowResult(row)
            for i in mine:
                result.results.append(finished[i].results)
                result.dirs.append(finished[i].run_dir)
                result.configs.append(owner[i][2].model_dump(mode="json"))
            done[row.label] = result
            if evidence is not None and len(done) < len(chosen):  # the page so far
                _write_pages(page(), command)
    rep = page()
    _write_pages(rep, command)
    return rep


def kept_runs(evidence: Path, row: PaperRow) -> RowResult | None:
    """Every finished run of ``row`` kept in ``evidence/runs/<row>/seed<k>``, with the config
    it recorded, whatever the table's config says now (a table whose config changed after
    its runs still shows them, marked by its ``changed`` date). None where there is none."""
    result = RowResult(row)
    for kept in sorted((evidence / "runs" / slug(row.label)).glob("seed*")):
        require_readable(kept)
        stored = stored_config(kept)
        if stored is None or not (kept / "cases.csv").is_file():
            continue
        result.results.append(read_results(kept / "results.json"))
        result.dirs.append(kept)
        result.configs.append(stored.model_dump(mode="json"))
    return result if result.results else None


def planned_configs(
    table: PaperTable, budget: str, budget_set: dict[str, Any], overrides: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The resolved config (seed 0 of the row) of every row that a mechanism check measures
    on its config alone (:data:`~.protocol.FROM_CONFIG`), run or not."""
    labels = {r for m in table.mechanisms if m.measure in FROM_CONFIG for r in m.rows}
    out = {}
    for row in table.rows:
        if row.label in labels:
            raw, path = row_config(row, budget, budget_set, overrides)
            out[row.label] = parse_config(raw, str(path)).model_dump(mode="json")
    return out


def planned_inert(table: PaperTable, planned: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Rows of ``table`` that a check of the config alone finds inert in its ``planned``
    configs (:func:`planned_configs`), each with the measurement."""
    return inert_labels(table.mechanisms, (measure(m, {}, planned) for m in table.mechanisms))


def _seed_runs(
    row: PaperRow, budget: str, budget_set: dict[str, Any], overrides: Sequence[str], seeds: int
) -> list[tuple[str, dict[str, Any], RunConfig, str]]:
    """Per seed of ``row``: its run name (``<row>/seed<k>``), raw config, parsed config and
    the config file it came from."""
    raw, path = row_config(row, budget, budget_set, overrides)
    out = []
    for k in range(seeds):
        run_raw = copy.deepcopy(raw)
        run_raw["seed"] = int(raw.get("seed", 0)) + k
        name = f"{slug(row.label)}/seed{run_raw['seed']}"
        out.append((name, run_raw, parse_config(run_raw, str(path)), str(path)))
    return out


def _write_pages(rep: Reproduction, command: str | None) -> None:
    """Analyse ``rep``'s finished rows and write its table to the output folder, and to the
    evidence folder (with the index) if it has one."""
    runs = {r.row.label: r.runs() for r in rep.rows}
    rep.analysis = analyse(
        rep.table,
        runs,
        rep.paper.metrics,
        seeds=rep.seeds,
        inert=rep.inert(),
        average=rep.paper.average,
    )
    write_table(rep, rep.out, command)
    if rep.evidence is not None:
        write_table(rep, rep.evidence, command)
        write_index(rep.evidence.parent)


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
