"""``fedseg report --out DIR``: report.md, report.csv and a self-contained report.html.

The HTML page carries its figures inline (base64 PNG) and loads nothing from elsewhere; it
links to each run's own files (results.md and the figures in its directory) by relative
path.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Callable
from pathlib import Path

from fedseg.errors import ConfigError
from fedseg.reporting.compare import (
    Report,
    Section,
    build_report,
    columns,
    report_csv,
    report_markdown,
    report_metrics,
    run_files,
    section_tests,
    show_value,
)
from fedseg.reporting.context import (
    MISSED_NOTE,
    marked,
    missed_regions,
    run_context,
    seeds_phrase,
)
from fedseg.reporting.paired import PairedRows
from fedseg.reporting.plots import (
    final_dsc,
    plot_row_curves,
    plot_site_bars,
    plot_training_curves,
)
from fedseg.reporting.results import METRIC_LABELS, privacy_note
from fedseg.reporting.runs import Run, load_run
from fedseg.reporting.segmentations import segmentation_figure
from fedseg.reporting.strip import short_labels
from fedseg.reporting.utilisation import utilisation_html

__all__ = ["report_html", "write_report"]

Figures = dict[str, list[tuple[str, Path]]]
RUN_CURVES = "training curves of"
SEGMENTATIONS = "segmentations of the test cases"

_CSS = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 16px}
th,td{border:1px solid #999;padding:3px 8px;text-align:right;font-size:14px}
th:first-child,td:first-child{text-align:left}
th{background:#e8e8e8}
.note{font-size:13px;margin:-8px 0 16px}
.warn{background:#fff3cd;border:1px solid #c9a400;padding:6px 10px;margin:6px 0}
img{display:block;margin:8px 0;max-width:100%}
.runs img{display:inline-block;width:49%;margin:4px 0.5% 4px 0}
"""


def write_report(
    report: Report | list[Path],
    out: Path,
    metrics: tuple[str, ...] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Write ``report.md``, ``report.csv``, ``report.html`` and the figures they show
    (``figures/``: learning curves, bars per site, the segmentations of fixed test cases,
    each run's curves) into ``out`` for a report or a list of run directories; return the
    written paths. Run directories are only read. ``progress(done, total)`` is called after
    each figure group and at the end."""
    if not isinstance(report, Report):
        report = build_report([load_run(d) for d in report])
    out = Path(out)
    figs = out / "figures"
    figures: Figures = {}
    total = sum(4 + len(s.rows) for s in report.sections) + 1
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    for k, section in enumerate(report.sections):
        shown = figures.setdefault(section.title, [])
        if any(run.rounds for row in section.rows for run in row.runs):
            path = plot_row_curves(section, figs / f"curves_{k}.png")
            shown.append(("learning curves", path))
        step()
        for m in report_metrics(section, metrics):
            if m in ("dsc", "hd95"):
                path = plot_site_bars(section, m, figs / f"bars_{k}_{m}.png")
                shown.append((f"{m.upper()} per site", path))
        step()
        tests = _tests(section, metrics)
        if tests is not None:
            path = tests.strip(figs / f"strip_{k}.png", section.title)
            shown.append(("per-case values (mean over seeds), median marked", path))
        step()
        drawn = segmentation_figure(section, figs / f"segmentations_{k}.png")
        if drawn is not None:
            shown.append((f"{SEGMENTATIONS} {', '.join(drawn[1])}", drawn[0]))
        step()
        names = short_labels([row.label for row in section.rows], width=60)
        rows = zip(names, section.rows, strict=True)
        each = [(name, run) for name, row in rows for run in row.runs]
        for i, (name, run) in enumerate(each):
            if run.rounds:
                path = figs / f"run_{k}_{i}.png"
                seed = run.config.get("seed", run.results.get("seed"))
                title = f"{name}, seed {seed} ({run.dir.name})".replace("\n", " ")
                final = final_dsc(run.dir / "results.json")
                plot_training_curves(run.rounds, path, title=title, final=final)
                shown.append((f"{RUN_CURVES} {run.dir}", path))
        for _ in section.rows:
            step()
    rel = {t: [(c, os.path.relpath(p, out)) for c, p in items] for t, items in figures.items()}
    written = [
        _write(out / "report.md", report_markdown(report, metrics, rel, out)),
        _write(out / "report.csv", report_csv(report)),
        _write(out / "report.html", report_html(report, metrics, figures, out)),
    ]
    step()
    return written + [p for items in figures.values() for _, p in items]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tests(section: Section, metrics: tuple[str, ...] | None) -> PairedRows | None:
    """The section's paired tests; None where they cannot be computed (report.md says why)."""
    try:
        return section_tests(section, metrics)
    except ConfigError:
        return None


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(section: Section, metric: str, k: int, missed: dict[str, set[tuple]]) -> str:
    cols = columns(section)
    unit = "" if metric in ("hd95", "assd", "hd") else " (%)"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["Method", "Seeds", *(c[2] for c in cols)])
    rows = []
    for row in section.rows:
        marks = missed[row.label]
        values = [marked(row.cell(metric, s, reg), metric, s, reg, marks) for s, reg, _ in cols]
        cells = [row.label, seeds_phrase(row.seeds), *values]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    caption = f"{METRIC_LABELS.get(metric, metric)}{unit}"
    note = ""
    if any(key[0] == metric for marks in missed.values() for key in marks):
        note = f'<p class="note">{html.escape(MISSED_NOTE)}.</p>'
    return (
        f'<table class="results" id="table-{k}-{metric}"><caption>{html.escape(caption)}</caption>'
        f"<tr>{head}</tr>{''.join(rows)}</table>{note}"
    )


def _context(section: Section) -> str:
    items = "".join(
        f"<li><b>{html.escape(r.label)}</b>: {html.escape(run_context(r.runs))}</li>"
        for r in section.rows
    )
    return f'<p class="context">How the rows were trained:</p><ul class="context">{items}</ul>'


def _links(run: Run, out: Path) -> str:
    files = run_files(run)
    hrefs = [html.escape(Path(os.path.relpath(p, out)).as_posix()) for p in files]
    links = " ".join(
        f'<a href="{h}">{html.escape(p.name)}</a>' for h, p in zip(hrefs, files, strict=True)
    )
    note = "".join(f"<br>{html.escape(x)}" for x in privacy_note(run.results.get("privacy")))
    return (
        f"<li>{html.escape(run.name)} ({html.escape(str(run.dir))}): {links or 'no files'}"
        f"<br>{html.escape(run_context([run]))}{note}{utilisation_html(run.rounds)}</li>"
    )


def report_html(
    report: Report, metrics: tuple[str, ...] | None, figures: Figures, out: Path
) -> str:
    """One HTML page: warnings, per section its settings, tables, inline figures and links
    to the runs' own files."""
    parts = ["<h1>fedseg report</h1>"]
    for w in report.warnings + [w for s in report.sections for w in s.warnings]:
        parts.append(f'<p class="warn"><b>Warning:</b> {html.escape(w)}.</p>')
    for k, section in enumerate(report.sections):
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if any(r.settings for r in section.rows):
            items = "".join(
                f"<li><b>{html.escape(r.label)}</b>: "
                + html.escape(", ".join(f"{key}={show_value(v)}" for key, v in r.settings.items()))
                + "</li>"
                for r in section.rows
            )
            parts.append(f"<ul>{items}</ul>")
        parts.append(_context(section))
        missed = {row.label: missed_regions(row.runs) for row in section.rows}
        parts += [_table(section, m, k, missed) for m in report_metrics(section, metrics)]
        if any(len(r.runs) > 1 for r in section.rows):
            parts.append("<p>Cells with several seeds: mean ± sample standard deviation.</p>")
        tests = _tests(section, metrics)
        if tests is not None:
            parts.append(tests.html())
        shown = figures.get(section.title, [])
        parts += [_img(p, c) for c, p in shown if not c.startswith(RUN_CURVES)]
        per_run = [_img(p, c) for c, p in shown if c.startswith(RUN_CURVES)]
        if per_run:
            parts.append(
                f'<h3>Training curves per run</h3><div class="runs">{"".join(per_run)}</div>'
            )
        runs = "".join(_links(run, out) for row in section.rows for run in row.runs)
        parts.append(f"<h3>Run files</h3><ul>{runs}</ul>")
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fedseg report</title><style>{_CSS}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
