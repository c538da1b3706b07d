"""Comparison tables across runs, laid out like the papers' tables (``fedseg report``).

Runs are grouped first by task (and evaluated sites): one section per task, so runs of
different tasks are never put in one table. Within a section, runs whose configs differ
only in ``seed`` (and engine settings that do not change the numbers) form one row whose
cells are the mean, and the mean ± sample standard deviation when the row has several
runs. A row is labelled by the config ``name`` plus the settings that tell it apart from
the other rows (where methods differ: the method, and of its own settings only those that
differ between its rows); settings outside ``method`` that differ between rows are reported as a
warning (the numbers are then not a fair comparison).
"""

from __future__ import annotations

import csv
import io
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedseg.errors import ConfigError
from fedseg.reporting.affinity import affinity_table
from fedseg.reporting.context import (
    MISSED_NOTE,
    marked,
    missed_regions,
    run_context,
    seeds_phrase,
)
from fedseg.reporting.paired import PairedRows, paired_rows
from fedseg.reporting.results import METRIC_LABELS, fmt, privacy_note
from fedseg.reporting.runs import Run, flat_config, load_run
from fedseg.reporting.utilisation import utilisation_markdown

__all__ = [
    "IGNORED_KEYS",
    "Report",
    "Row",
    "Section",
    "build_report",
    "columns",
    "comparison_table",
    "load_results",
    "report_csv",
    "report_markdown",
    "report_metrics",
    "run_files",
    "section_tests",
    "seeds_text",
    "show_value",
]

IGNORED_KEYS = (
    "seed",
    "eval.every",
    "eval.batch_size",
    "eval.save_models",
    "tracking.tensorboard",
    "tracking.mlflow",
)
"""Config keys that do not define a row: seeds are repeats, the others change only what is
logged during training or the speed, as do all ``engine.*`` keys (the engines give
bit-identical results, docs/architecture.md)."""


@dataclass
class Row:
    """Runs of one config (all seeds) and the settings that distinguish it in its section."""

    name: str
    key: tuple[tuple[str, str], ...]
    runs: list[Run]
    settings: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def seeds(self) -> list[Any]:
        return [r.config.get("seed", r.results.get("seed")) for r in self.runs]

    def stat(self, metric: str, site: str, region: str) -> tuple[float, float | None]:
        """Mean over the row's runs and their sample standard deviation (None for one run)
        of ``metric`` on ``region`` at ``site`` (``"Average"`` for the runs' averages)."""
        values = [
            (r.results["average"] if site == "Average" else r.results["sites"][site])[metric][
                region
            ]
            for r in self.runs
        ]
        values = [math.nan if v is None else float(v) for v in values]
        mean = statistics.fmean(values)
        return mean, statistics.stdev(values) if len(values) > 1 else None

    def cell(self, metric: str, site: str, region: str) -> str:
        mean, std = self.stat(metric, site, region)
        return fmt(mean, metric) if std is None else f"{fmt(mean, metric)} ± {fmt(std, metric)}"


@dataclass
class Section:
    """The rows of one task evaluated on the same sites and regions."""

    task: str
    sites: list[str]
    regions: list[str]
    rows: list[Row]
    warnings: list[str]

    @property
    def title(self) -> str:
        return f"{self.task}: sites {', '.join(self.sites)}"


@dataclass
class Report:
    sections: list[Section]
    warnings: list[str]

    @property
    def runs(self) -> list[Run]:
        return [run for s in self.sections for row in s.rows for run in row.runs]


_UNSET = object()


def load_results(run_dir: Path) -> dict[str, Any]:
    """Read ``results.json`` of a finished run."""
    return load_run(run_dir).results


def _config_of(run: Run) -> dict[str, Any]:
    """The run's flattened config (from its results when it has no ``config.yaml``)."""
    if run.config:
        return flat_config(run.config)
    res = run.results
    return {
        "name": res.get("name", run.dir.name),
        "method.name": res["method"],
        "data.labels": res.get("labels"),
        "seed": res.get("seed"),
    }


def _defining(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in IGNORED_KEYS and not k.startswith("engine.")}


def show_value(value: Any) -> str:
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def build_report(runs: list[Run]) -> Report:
    """Group ``runs`` into sections (task, sites, regions) and rows (configs up to seed)."""
    if not runs:
        raise ConfigError("report: give at least one run directory")
    on_disk = [r.dir.resolve() for r in runs if r.dir.is_dir()]
    twice = sorted({str(d) for d in on_disk if on_disk.count(d) > 1})
    if twice:
        raise ConfigError(f"report: run directories given more than once: {twice}")
    by_section: dict[tuple, list[Run]] = {}
    for run in runs:
        sites = tuple(run.results["sites"])
        if not sites:
            raise ConfigError(f"{run.dir}: results.json has no evaluated site")
        regions = tuple(next(iter(run.results["average"].values())))
        by_section.setdefault((run.task, sites, regions), []).append(run)
    sections = [
        _section(task, list(sites), list(regions), members)
        for (task, sites, regions), members in by_section.items()
    ]
    warnings = []
    if len(sections) > 1:
        warnings.append(
            f"the runs cover {len(sections)} different tasks or site sets "
            f"({'; '.join(s.title for s in sections)}): one table each"
        )
    return Report(sections, warnings)


def _section(task: str, sites: list[str], regions: list[str], runs: list[Run]) -> Section:
    rows: dict[tuple, Row] = {}
    configs = {}
    for run in runs:
        cfg = _defining(_config_of(run))
        key = tuple(sorted((k, repr(v)) for k, v in cfg.items()))
        configs[key] = cfg
        row = rows.setdefault(key, Row(str(cfg.get("name", run.name)), key, []))
        row.runs.append(run)
    peers = list(configs.values())
    differing = _differing(peers)
    for row in rows.values():
        cfg = configs[row.key]
        row.settings = {k: cfg[k] for k in _distinguishing(cfg, peers) if k != "name"}
        twins = [configs[r.key] for r in rows.values() if r.name == row.name]
        own = {k: cfg[k] for k in _distinguishing(cfg, twins)}  # vs rows of the same name
        shown = ", ".join(f"{k}={show_value(v)}" for k, v in own.items())
        row.label = f"{row.name} ({shown})" if shown else row.name
    warnings = []
    for k in differing:
        if k == "name" or k.startswith("method."):
            continue
        by_value: dict[str, list[str]] = {}
        for row in rows.values():
            value = show_value(configs[row.key][k]) if k in configs[row.key] else "unset"
            by_value.setdefault(value, []).append(row.label)
        values = "; ".join(f"{v} in {', '.join(labels)}" for v, labels in by_value.items())
        warnings.append(f"{task}: rows differ in {k} ({values}), not only in the method")
    return Section(task, sites, regions, list(rows.values()), warnings)


def _distinguishing(cfg: dict[str, Any], peers: list[dict[str, Any]]) -> list[str]:
    """The keys of ``cfg`` that tell it apart from ``peers``. Where the peers' methods differ,
    ``method.name`` says so, and of the other method settings only those that differ between
    peers of the same method are listed (each method's own defaults are not a difference)."""
    keys = [k for k in _differing(peers) if k in cfg]
    if "method.name" not in keys:
        return keys
    same = _differing([p for p in peers if p.get("method.name") == cfg.get("method.name")])
    return [k for k in keys if not k.startswith("method.") or k == "method.name" or k in same]


def _differing(configs: list[dict[str, Any]]) -> list[str]:
    """Keys whose value (or presence) is not the same in every config."""
    keys = sorted({k for cfg in configs for k in cfg})
    return [k for k in keys if len({repr(cfg.get(k, _UNSET)) for cfg in configs}) > 1]


def report_metrics(section: Section, metrics: tuple[str, ...] | None) -> tuple[str, ...]:
    first = section.rows[0].runs[0].results["average"]
    if metrics is None:
        return tuple(m for m in ("dsc", "hd95") if m in first)
    unknown = [m for m in metrics if any(m not in r.results["average"] for r in _all(section))]
    if unknown:
        raise ConfigError(f"metrics {unknown} are not in every run's results.json")
    return metrics


def _all(section: Section) -> list[Run]:
    return [run for row in section.rows for run in row.runs]


def columns(section: Section) -> list[tuple[str, str, str]]:
    """``(site, region, header)`` for every site and the average."""
    multi = len(section.regions) > 1
    return [
        (s, reg, f"{s} {reg}" if multi else s)
        for s in [*section.sites, "Average"]
        for reg in section.regions
    ]


def seeds_text(row: Row) -> str:
    return ", ".join(show_value(s) for s in row.seeds)


def report_markdown(
    report: Report,
    metrics: tuple[str, ...] | None = None,
    figures: dict[str, list[tuple[str, str]]] | None = None,
    base: Path | None = None,
) -> str:
    """The report as Markdown: warnings, then per section one table per metric (rows x
    site/region and average), its figures (``figures[section title]``: (caption, path)),
    and per run its own files (paths relative to ``base``) and last affinity matrix."""
    out = ["# fedseg report", ""]
    warnings = report.warnings + [w for s in report.sections for w in s.warnings]
    out += [f"**Warning:** {w}." for w in warnings]
    if warnings:
        out.append("")
    for section in report.sections:
        out += [f"## {section.title}", ""]
        setting_rows = [r for r in section.rows if r.settings]
        if setting_rows:
            out += ["| Row | Settings | Seeds |", "|---|---|---|"]
            for row in section.rows:
                shown = ", ".join(f"{k}={show_value(v)}" for k, v in row.settings.items())
                out.append(f"| {row.label} | {shown} | {seeds_phrase(row.seeds)} |")
            out.append("")
        out += ["How the rows were trained:", ""]
        out += [f"- {row.label}: {run_context(row.runs)}" for row in section.rows] + [""]
        missed = {row.label: missed_regions(row.runs) for row in section.rows}
        for m in report_metrics(section, metrics):
            cols = columns(section)
            unit = " (%)" if m not in ("hd95", "assd", "hd") else ""
            head = ["Method", "Seeds"] + [h for _, _, h in cols]
            out += [
                f"### {METRIC_LABELS.get(m, m)}{unit}",
                "",
                "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head),
            ]
            for row in section.rows:
                marks = missed[row.label]
                cells = [marked(row.cell(m, s, reg), m, s, reg, marks) for s, reg, _ in cols]
                out.append("| " + " | ".join([row.label, seeds_phrase(row.seeds), *cells]) + " |")
            out.append("")
            if any(k[0] == m for marks in missed.values() for k in marks):
                out += [f"{MISSED_NOTE}.", ""]
        if any(len(r.runs) > 1 for r in section.rows):
            out += ["Cells with several seeds: mean ± sample standard deviation.", ""]
        try:
            tests = section_tests(section, metrics)
            out += tests.markdown() if tests else []
        except ConfigError as e:
            out += [f"Paired tests not computed: {e.reason}.", ""]
        for caption, path in (figures or {}).get(section.title, []):
            out += [f"![{caption}]({path})", ""]
        on_disk = [run for run in _all(section) if run.dir.is_dir()]
        out += ["### Run files", ""] if on_disk else []
        for run in on_disk:
            links = ", ".join(f"[{p.name}]({_rel(p, base)})" for p in run_files(run))
            out.append(f"- {run.name} ({run.dir}): {links or 'no files'}")
            out.append(f"  {run_context([run])}")
            out += [f"  {line}" for line in privacy_note(run.results.get("privacy"))]
            if any("affinity" in (rec.get("server") or {}) for rec in run.rounds):
                out += ["", affinity_table(run.dir)]
            use = utilisation_markdown(run.rounds)
            out += ["", *use] if use else []
        out.append("")
    return "\n".join(out)


def section_tests(section: Section, metrics: tuple[str, ...] | None) -> PairedRows | None:
    """Each row of ``section`` against its first row on paired test cases (None for one row
    or runs without ``cases.csv``)."""
    return paired_rows(
        [row.label for row in section.rows],
        [[run.dir / "cases.csv" for run in row.runs] for row in section.rows],
        report_metrics(section, metrics),
    )


def run_files(run: Run) -> list[Path]:
    """A run's own readable outputs: its figures and ``results.md``."""
    return sorted(run.dir.glob("*.png")) + [p for p in [run.dir / "results.md"] if p.is_file()]


def _rel(path: Path, base: Path | None) -> str:
    return Path(os.path.relpath(path, base) if base is not None else path).as_posix()


def report_csv(report: Report) -> str:
    """Long-format CSV: one line per section x row x metric x site x region, with the mean,
    the sample standard deviation (empty for one run) and the runs it covers. Overlap
    metrics are fractions here (not %)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["task", "row", "settings", "seeds", "runs", "metric", "site", "region", "mean", "std"]
    )
    for section in report.sections:
        metrics = [
            m
            for m in section.rows[0].runs[0].results["average"]
            if all(m in r.results["average"] for r in _all(section))
        ]
        for row in section.rows:
            shown = "; ".join(f"{k}={show_value(v)}" for k, v in row.settings.items())
            runs = " ".join(str(r.dir) for r in row.runs)
            for m in metrics:
                for site, region, _ in columns(section):
                    mean, std = row.stat(m, site, region)
                    w.writerow(
                        [
                            *(section.task, row.label, shown, seeds_text(row), runs),
                            *(m, site, region, repr(mean), "" if std is None else repr(std)),
                        ]
                    )
    return buf.getvalue()


def comparison_table(
    results: list[dict[str, Any]], metrics: tuple[str, ...] = ("dsc", "hd95")
) -> str:
    """Markdown of already loaded ``results.json`` dicts (runs without a directory)."""
    runs = [Run(Path(str(r.get("name", "run"))), {}, r) for r in results]
    return report_markdown(build_report(runs), metrics)
