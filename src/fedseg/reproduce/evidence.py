"""A reproduced table's page: table.md, table.csv, claims.csv, the strip plot and the command,
and the index of every evidence page (``docs/evidence/README.md``)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from fedseg.reporting.stats import ALPHA, Comparison, format_p
from fedseg.reproduce.papers import PaperTable
from fedseg.reproduce.parity import authors_claims, parity_lines
from fedseg.reproduce.protocol import NOT_TESTABLE, Changed, Cost
from fedseg.reproduce.rows import Reproduction

__all__ = ["render_claims_csv", "render_csv", "render_markdown", "write_index", "write_table"]

_ALIASES = {
    "dsc": ("DSC", "Dice"),
    "jaccard": ("mIoU", "IoU", "Jaccard"),
    "hd95": ("HD95",),
    "hd": ("HD",),
    "assd": ("ASSD",),
    "precision": ("Precision",),
    "recall": ("Recall",),
}
_LABELS = {
    "dsc": "DSC",
    "jaccard": "mIoU",
    "hd95": "HD95",
    "hd": "HD",
    "assd": "ASSD",
    "precision": "precision",
    "recall": "recall",
}


def _num(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def paper_values(rep: Reproduction, label: str, metric: str) -> str:
    """The paper's published values of ``metric`` for a row: the table's ``paper_columns``
    of the metric, or every column named after it."""
    t = rep.table
    row = t.row(label)
    if metric in t.paper_columns:
        cols = [t.columns.index(c) for c in t.paper_columns[metric]]
    else:
        cols = [i for i, c in enumerate(t.columns) if c.split()[-1] in _ALIASES.get(metric, ())]
    values = [row.published[i] for i in cols if row.published and row.published[i] is not None]
    return "/".join(f"{v:g}" for v in values) or "—"


def _diff(c: Comparison) -> tuple[str, str]:
    """A comparison's median difference and its 95 % interval (or why it was refused)."""
    s = c.stats
    if c.refused or s is None:
        return f"refused: {c.refused}", "—"
    return _num(s.median), _interval(s.low, s.high)


def _machine_name(res: dict[str, Any]) -> str:
    """What a run's timings belong to: its GPU where it trained on one, else its CPU model."""
    m = res.get("machine")
    if not m:
        return "not recorded (runs before 2026-11-27)"
    device = str(m.get("device", "cpu"))
    return m["cpu"] if device == "cpu" else f"{device} on {m['cpu']}"


def _machines_line(rep: Reproduction) -> str:
    """Which machines the runs ran on (wall and CPU seconds compare only within one)."""
    counts = Counter(_machine_name(res) for rr in rep.rows for res in rr.results)
    where = "; ".join(f"{name}: {n}" for name, n in sorted(counts.items()))
    return f"Runs per machine (times compare only within one): {where}."


DISTANCES = ("hd95", "hd", "assd")
_AVERAGED = {
    "sites": "sites",
    "cases": "sites weighted by their test cases (as the paper averages)",
}
FINDINGS = ("holds", "contradicted", "unresolved")
"""Verdicts that read as findings; at a budget other than ``evidence`` or ``paper`` the page
shows "<budget>: not evidence" instead (a smoke run proves only that the rows run)."""


def metric_label(rep: Reproduction, metric: str) -> str:
    """A metric's column label with its unit (``%`` for overlaps, the paper's
    ``distance_unit`` for distances)."""
    unit = rep.paper.distance_unit if metric in DISTANCES else "%"
    return f"{_LABELS.get(metric, metric)} ({unit})"


def _interval(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{_num(low)}, {_num(high)}]"


def _changed_lines(rep: Reproduction) -> list[str]:
    c = rep.table.changed
    if c is None:
        return []
    return [
        f"> **Config changed on {c.date}, rows pending rerun.** {c.what} The runs, numbers and "
        "verdicts below are those of the old config: not current.",
        "",
    ]


def _rows_lines(rep: Reproduction) -> list[str]:
    """Ours: per metric the mean ± sd over seeds and, in its own column, the 95 % interval
    of the mean; then the published values of the task our rows run."""
    t, a, metrics = rep.table, rep.analysis, rep.paper.metrics
    head = ["row", "seeds"]
    for m in metrics:
        head += [metric_label(rep, m), "95 % CI"]
    head += ["wall s", "CPU s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rr in rep.rows:
        label = rr.row.label
        cells = [label, str(len(rr.results))]
        for m in metrics:
            s = a.summaries[(label, m)] if a else None
            if s is None:
                cells += ["n/a", "—"]
            elif s.sd is None:
                cells += [_num(s.mean), "—"]
            else:
                cells += [f"{_num(s.mean)} ± {_num(s.sd)}", _interval(s.low, s.high)]
        cells += [f"{rr.seconds:.0f}", f"{rr.cpu_seconds:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    published = [r for r in t.rows if r.published]
    if published:
        head = ["row"] + [f"paper {_LABELS.get(m, m)}" for m in metrics]
        lines += [
            "",
            f"Published ({t.source}; the columns of the task our rows run, several joined by /):",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for r in published:
            values = [paper_values(rep, r.label, m) for m in metrics]
            lines.append("| " + " | ".join([r.label, *values]) + " |")
    return lines


def _protocol_lines(rep: Reproduction) -> list[str]:
    """The protocol sheet: the paper's setting beside the runs', each difference marked."""
    t = rep.table
    if not t.protocol:
        return []
    cpu_h = sum(rr.cpu_seconds for rr in rep.rows) / 3600
    lines = [
        "",
        "### Protocol: the paper's training beside ours",
        "",
        "**forced**: the evidence size or budget needs it (cost: the CPU hours this table's "
        f"runs would take with the paper's setting, from their measured {cpu_h:.1f} CPU h"
        f"{'' if rep.rows else ': none run yet, so no cost is given'}); "
        "**unforced**: removed from the config, rows pending rerun; **not stated**: the paper "
        "does not say. Recorded: what the kept runs' configs hold.",
        "",
        "| aspect | paper | ours | recorded | status |",
        "|---|---|---|---|---|",
    ]
    for item in t.protocol:
        status = f"**{item.status}**" if item.status in ("forced", "unforced") else item.status
        if item.cost is not None and rep.rows:
            status += _cost_text(rep, item.cost, item.aspect, cpu_h)
        if item.why:
            status += f"; {item.why}"
        recorded = "; ".join(f"`{k}` {_recorded(rep, k)}" for k in item.keys) or "—"
        lines.append(f"| {item.aspect} | {item.paper} | {item.ours} | {recorded} | {status} |")
    return lines


def _cost_text(rep: Reproduction, c: Cost, aspect: str, cpu_h: float) -> str:
    """``: about N CPU h (basis)`` for a forced difference's cost ``c``; where it scales with
    a key the kept runs did not record as one positive number, says so instead."""
    if not c.per:
        return f": about {c.factor * cpu_h:,.0f} CPU h ({c.basis})"
    values = _recorded_values(rep, c.per)
    try:
        (ours,) = (float(v) for v in values)
    except ValueError:
        ours = 0.0
    if ours <= 0:
        return f": no cost given (`{c.per}` recorded as {' / '.join(values)})"
    return f": about {c.paper / ours * cpu_h:,.0f} CPU h ({c.paper:g} / {ours:g} {aspect})"


def _recorded_values(rep: Reproduction, key: str) -> list[str]:
    """The distinct values of config ``key`` over the table's kept runs, in run order."""
    values = []
    for rr in rep.rows:
        for cfg in rr.configs:
            node: Any = cfg
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if str(node) not in values:
                values.append(str(node))
    return values


def _recorded(rep: Reproduction, key: str) -> str:
    """The values of config ``key`` over the table's kept runs (several joined by /)."""
    return " / ".join(_recorded_values(rep, key)) or "—"


def _mechanism_lines(rep: Reproduction) -> list[str]:
    t = rep.table
    if not t.mechanisms:
        return []
    found = rep.measurements()
    lines = [
        "",
        "### Mechanism checks at this size",
        "",
        "Measured on the kept runs (`rounds.jsonl`, configs; a check of the config alone also "
        "on a row not run, from the config it would run); a row whose mechanism is inert gets "
        "no verdict (*not testable at this size*).",
        "",
        "| check | row | measured | inert below | reading |",
        "|---|---|---|---|---|",
    ]
    for m in t.mechanisms:
        for label in m.rows:
            got = found[m.id].get(label)
            if got is None:
                lines.append(f"| {m.what} | {label} | not run | — | — |")
                continue
            bound = "—" if m.inert_below is None else f"{m.inert_below:g}"
            reading = (
                "measured only"
                if m.inert_below is None
                else "**inert**"
                if got.value < m.inert_below
                else "acts"
            )
            lines.append(f"| {m.what} | {label} | {got.text} | {bound} | {reading} |")
    needs = [f"- {m.what}: {m.needs}" for m in t.mechanisms if m.needs]
    return [*lines, "", *needs] if needs else lines


def render_markdown(rep: Reproduction) -> str:
    """The page: rows over seeds beside the paper, the strip plot, the protocol sheet, the
    mechanism checks, the claims and every row against the references."""
    t, a = rep.table, rep.analysis
    budget = ", ".join(f"{k}={v}" for k, v in rep.overrides.items()) or "shipped configs"
    measured = rep.paper.evidence_budgets.get(t.federation or "")
    if rep.budget == "evidence" and measured is not None and measured.status == "capped":
        budget += (
            "; capped: the largest budget this table fits in about 3 hours on 2 cores, reached "
            "before every control row converged (docs/reproduce.md#the-evidence-budget)"
        )
    seeds = sorted({len(r.results) for r in rep.rows})
    lines = [
        f"## {rep.paper.title}: {t.title}",
        "",
        *_changed_lines(rep),
        f"Budget `{rep.budget}` ({budget}); seeds per row: {_listed(seeds)}. "
        "Ours: synthetic federations, so the ordering of rows and the gaps between them are "
        f"what compares with the paper. A cell is the mean over seeds of the average over "
        f"{_AVERAGED[rep.paper.average]} and regions ± the sample sd over seeds; beside it the "
        "95 % interval of the mean "
        f"(overlaps in %, distances in {rep.paper.distance_unit}).",
        "",
        *_rows_lines(rep),
    ]
    runs = sum(len(rr.results) for rr in rep.rows)
    wall, cpu = (sum(getattr(rr, k) for rr in rep.rows) / 3600 for k in ("seconds", "cpu_seconds"))
    if runs:
        lines += [
            "",
            f"Time of the table, summed over its {runs} runs: {wall:.2f} h wall, {cpu:.2f} h "
            "CPU. " + _machines_line(rep),
        ]
    if a is not None and a.cases:
        lines += ["", "![Per-case values of every row, with each row's median](strip.png)"]
    if t.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in t.notes]
    lines += _protocol_lines(rep)
    lines += _mechanism_lines(rep)
    if a is None:
        return "\n".join(lines) + "\n"
    if a.claims:
        lines += [
            "",
            "### Claims",
            "",
            f"Verdicts: paired Wilcoxon signed-rank test over test cases (each case averaged over "
            f"regions and seeds), Holm-adjusted within this table, at {ALPHA}; closeness: the "
            "bootstrap 95 % interval of the median difference inside the margin "
            "(docs/reproduce.md#reading-a-verdict).",
            "",
            "| claim | the paper says | source | metric | paper | pair | median difference "
            "| 95 % CI | pairs | p (Holm) | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for v in a.claims:
            c = v.claim
            paper = "; ".join(
                f"{x} {paper_values(rep, x, c.metric)} vs {y} {paper_values(rep, y, c.metric)}"
                for x, y in c.pairs()
            )
            comps = v.comparisons
            pair = "; ".join(f"{x.row} − {x.other}" for x in comps) or "—"
            medians = "; ".join(_diff(x)[0] for x in comps) or "—"
            cis = "; ".join(_diff(x)[1] for x in comps) or "—"
            pairs = ", ".join(str(x.stats.pairs) for x in comps if x.stats) or "—"
            ps = ", ".join(format_p(x.p_holm) for x in comps if x.stats) or "—"
            margin = f" (margin {c.within:g})" if c.within else ""
            verdict = f"**{v.verdict}**" + (f" ({v.reason})" if v.verdict != "holds" else "")
            if rep.budget not in ("evidence", "paper") and v.verdict in FINDINGS:
                verdict = f"{rep.budget}: not evidence"  # proves that the rows run, no more
            lines.append(
                f"| {c.id} | {c.says}{margin} | {c.source} | {metric_label(rep, c.metric)} "
                f"| {paper} | {pair} | {medians} | {cis} | {pairs} | {ps} | {verdict} |"
            )
    if a.references:
        lines += [
            "",
            f"### Every row against {', '.join(t.reference)}",
            "",
            "Median paired difference (row − reference) over test cases with its bootstrap 95 % "
            "interval; `better`/`worse` when Holm-adjusted p < "
            f"{ALPHA} in the metric's own direction.",
            "",
            "| row | vs | metric | pairs | median difference | 95 % CI | p | p (Holm) | reading |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in a.references:
            n = str(c.stats.pairs) if c.stats else "—"
            p = format_p(c.stats.p) if c.stats else "—"
            median, ci = _diff(c)
            lines.append(
                f"| {c.row} | {c.other} | {metric_label(rep, c.metric)} | {n} | {median} | {ci} "
                f"| {p} | {format_p(c.p_holm)} | {c.better()} |"
            )
    lines += parity_lines(rep)
    return "\n".join(lines) + "\n"


def render_csv(rep: Reproduction) -> str:
    """One line per row and metric, then per row, reference and metric: the statistics."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "row",
            "metric",
            "mean",
            "sd",
            "n_seeds",
            "ci_low",
            "ci_high",
            "vs",
            "pairs",
            "dropped",
            "p",
            "p_holm",
            "median_diff",
            "diff_low",
            "diff_high",
            "verdict",
            "paper",
            "wall_s",
            "cpu_s",
        ]
    )
    a = rep.analysis
    refs: dict[tuple[str, str], list[Comparison]] = {}
    for c in a.references if a else []:
        refs.setdefault((c.row, c.metric), []).append(c)
    for rr in rep.rows:
        label = rr.row.label
        for m in rep.paper.metrics:
            s = a.summaries[(label, m)] if a else None
            base = [
                label,
                m,
                s.mean if s else "",
                _blank(s.sd if s else None),
                s.n if s else "",
                _blank(s.low if s else None),
                _blank(s.high if s else None),
            ]
            tail = [paper_values(rep, label, m), round(rr.seconds, 1), round(rr.cpu_seconds, 1)]
            w.writerow(base + [""] * 9 + tail)
            for c in refs.get((label, m), []):
                w.writerow([*base, c.other, *_stat_cells(c), c.better(), *tail])
    return buf.getvalue()


def _stat_cells(c: Comparison | None) -> list[Any]:
    """pairs, dropped, p, p_holm, median, low, high of a comparison (blank when not tested)."""
    st = c.stats if c else None
    if c is None or st is None:
        return [""] * 7
    return [st.pairs, st.dropped, st.p, _blank(c.p_holm), st.median, st.low, st.high]


def _blank(v: float | None) -> Any:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else v


def render_claims_csv(rep: Reproduction) -> str:
    """One line per claim and compared pair: the statistics and the claim's verdict."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "claim",
            "kind",
            "metric",
            "row",
            "vs",
            "margin",
            "pairs",
            "dropped",
            "p",
            "p_holm",
            "median_diff",
            "diff_low",
            "diff_high",
            "pair_verdict",
            "verdict",
        ]
    )
    for v in rep.analysis.claims if rep.analysis else []:
        c = v.claim
        for x in v.comparisons or [None]:
            pair = "" if x is None else (x.better() if c.kind == "better" else x.close(c.within))
            pair = {"better": "holds", "worse": "contradicted"}.get(pair, pair)
            row = [x.row, x.other] if x else ["", ""]
            w.writerow(
                [c.id, c.kind, c.metric, *row, _blank(c.within), *_stat_cells(x), pair, v.verdict]
            )
    return buf.getvalue()


def strip_plot(rep: Reproduction, path: Path) -> Path | None:
    """Per metric, each row's per-case values (seed means) as a strip with the row's median."""
    from fedseg.reporting.strip import strip_figure

    a = rep.analysis
    if a is None or not a.cases:
        return None
    labels = [r.row.label for r in rep.rows]
    panels = {
        metric_label(rep, m): [list(a.cases[(label, m)].values()) for label in labels]
        for m in rep.paper.metrics
    }
    return strip_figure(labels, panels, f"{rep.paper.name} {rep.table.name}", path)


def write_table(rep: Reproduction, folder: Path, command: str | None) -> None:
    """Write the page of ``rep`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(render_markdown(rep))
    (folder / "table.csv").write_text(render_csv(rep))
    (folder / "claims.csv").write_text(render_claims_csv(rep))
    strip_plot(rep, folder / "strip.png")
    if command:
        (folder / "command.txt").write_text(command + "\n")
    summary = {
        "paper": rep.paper.name,
        "title": f"{rep.paper.title}: {rep.table.title}",
        "table": rep.table.name,
        "budget": rep.budget,
        "overrides": {k: str(v) for k, v in rep.overrides.items()},
        "seeds": {r.row.label: len(r.results) for r in rep.rows},
        "rows": len(rep.table.rows),
        "changed": rep.table.changed.date if rep.table.changed else None,
        "claims": [
            {"id": v.claim.id, "says": v.claim.says, "verdict": v.verdict, "reason": v.reason}
            for v in (rep.analysis.claims if rep.analysis else [])
        ],
    }
    theirs = {v.claim.id: v for v in authors_claims(rep)[0]}
    for c in summary["claims"]:
        if c["id"] in theirs:
            c["authors"] = {"verdict": theirs[c["id"]].verdict, "reason": theirs[c["id"]].reason}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


INDEX_HEAD = """# Evidence: the papers' claims and their verdicts

Generated by `fedseg reproduce ... --budget evidence` (docs/reproduce.md explains how to read a
verdict). Each page holds the table, the statistics (`table.csv`, `claims.csv`), a strip plot of
the per-case metric, the exact command and the small files of every finished run (`runs/`), so
the statistics can be recomputed and an interrupted table continues on another machine. The
claims were written down before any run was read against them: [claims.md](claims.md).
"""


READINGS = "readings.md"


def write_index(root: Path) -> Path | None:
    """``root/README.md``: a link to the hand-written ``readings.md`` where it exists; per
    paper, the count of its claims by verdict, then each table:
    its page (budget, rows run, seeds, each claim's verdict) or, before it has run, its
    claims as ``not run``. Pages of tables not in a paper file follow. A ``README.md`` there
    that is not such an index (a hand-written page, e.g. of docs/evidence/checks/, where
    ``--evidence`` may keep a check's page) is left as it is, and None returned."""
    from fedseg.reproduce.papers import list_papers, load_paper

    index = root / "README.md"
    if index.is_file() and not index.read_text().startswith(INDEX_HEAD.splitlines()[0]):
        return None

    pages = {}
    for summary in sorted(root.glob("*/summary.json")):
        s = json.loads(summary.read_text())
        pages[(s["paper"], s["table"])] = (summary.parent.name, s)
    body, counts, overview = [], {}, []
    for name in list_papers():
        paper = load_paper(name)
        tally = counts.setdefault(paper.title, {})
        body += [f"## {paper.title}", ""]
        for t in paper.tables.values():
            folder, s = pages.pop((name, t.name), (None, None))
            if s is None:
                claims = [{"id": c.id, "says": c.says, "verdict": "not run"} for c in t.claims]
                body += [f"### {t.title}", "", "Not run at the evidence budget yet.", ""]
            else:
                claims = [_current(c, t.changed) for c in s["claims"]]
                body += _page_lines(folder, {**s, "claims": claims}, t.title)
            for c in claims:
                tally[c["verdict"]] = tally.get(c["verdict"], 0) + 1
            if claims and s is None:
                body += ["| claim | says | verdict |", "|---|---|---|"]
                body += [f"| {c['id']} | {c['says']} | {c['verdict']} |" for c in claims]
                body.append("")
            overview.append(_overview_line(name, t, folder, claims))
    if pages:
        body += ["## Other evidence pages", ""]
        for folder, s in pages.values():
            body += _page_lines(folder, s, s["title"])
    verdicts = (
        "holds",
        "contradicted",
        "unresolved",
        "refused",
        NOT_TESTABLE,
        PENDING,
        "not run",
    )
    lines = [INDEX_HEAD]
    if (root / READINGS).is_file():
        link = f"[{READINGS}]({READINGS})"
        lines += [f"What the verdicts say, paper by paper, and where each is checked: {link}.", ""]
    lines.append("| paper | claims | " + " | ".join(verdicts) + " |")
    lines.append("|---|---|" + "---|" * len(verdicts))
    for title, tally in counts.items():
        cells = " | ".join(str(tally.get(v, 0)) for v in verdicts)
        lines.append(f"| {title} | {sum(tally.values())} | {cells} |")
    lines += [
        "",
        "## What each table's verdicts are conditional on",
        "",
        "The forced deviations from the paper's protocol that remain (each table's protocol "
        "sheet, on its page, gives the paper's setting and the cost of following it); "
        f"*{PENDING}*: the table's config changed after its runs.",
        "",
        "| paper | table | verdicts | remaining forced deviations |",
        "|---|---|---|---|",
        *overview,
        "",
        *body,
    ]
    lines += _budget_lines(root)
    lines += _archive_lines(root)
    index.write_text("\n".join(lines))
    return index


PENDING = "pending rerun"
"""The index's reading of a claim whose table's config changed after its runs."""


def _current(claim: dict[str, Any], changed: Changed | None) -> dict[str, Any]:
    """A page's claim as the index counts it: ``pending rerun`` (naming the old verdict)
    where the table's config changed after the page was rendered."""
    if changed is None:
        return claim
    was = claim["verdict"]
    return {**claim, "verdict": PENDING, "reason": f"config changed on {changed.date}; was {was}"}


def _overview_line(paper: str, t: PaperTable, folder: str | None, claims: list[dict]) -> str:
    tally = Counter(c["verdict"] for c in claims)
    verdicts = ", ".join(f"{n} {v}" for v, n in tally.items()) or "no claims"
    name = f"[{t.name}]({folder}/table.md)" if folder else t.name
    if not t.protocol:
        forced = "no protocol sheet"
    else:
        forced = "; ".join(f"{i.aspect}: {i.ours.split('; ')[0]}" for i in t.forced()) or "none"
    return f"| {paper} | {name} | {verdicts} | {forced} |"


def _budget_lines(root: Path) -> list[str]:
    """The evidence budget of every federation in the paper files, with the last attempt's
    gains and final validation DSC of the control rows."""
    from fedseg.reproduce.papers import list_papers, load_paper

    rows = []
    for name in list_papers():
        for fed, b in load_paper(name).evidence_budgets.items():
            m = b.measured
            last = str(b.overrides.get("train.rounds", ""))
            gains, finals = (m.get(k, {}).get(last, {}) for k in ("gains", "final_val_dsc"))
            controls = "; ".join(
                f"{row} {gains[row]:+.2f} / {finals.get(row, float('nan')):.1f}" for row in gains
            )
            fixed = ", ".join(f"{k}={v}" for k, v in b.overrides.items())
            folder = root / "budgets" / f"{name}-{fed}"
            label = f"[{fed}](budgets/{folder.name}/budget.md)" if folder.is_dir() else fed
            basis = "rows' probes" if (folder / "probes").is_dir() else "controls' cost (low)"
            rows.append(
                f"| {label} | {name} | {fixed} | {b.status} | {controls} "
                f"| {m.get('table_hours', '')} from {basis} |"
            )
    if not rows:
        return []
    return [
        "## Evidence budgets",
        "",
        "Measured on the control rows only (docs/reproduce.md#the-evidence-budget): gain of "
        "validation DSC over the last quarter of the rounds / final validation DSC, means over "
        "2 seeds; `capped`: the largest budget whose largest table fits about 3 hours on 2 "
        "cores; budgets measured before per-row cost probes estimated every row at the "
        "controls' cost, which is low for tables whose methods cost more.",
        "",
        "| federation | paper | budget | status | controls: gain / final | table hours (est.) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _archive_lines(root: Path) -> list[str]:
    """A link to each archived set of pages (``root/archive/<set>/README.md``, whose heading
    says what superseded them); their verdicts are not counted in the index."""
    sets = sorted((root / "archive").glob("*/README.md"))
    if not sets:
        return []
    lines = [
        "## Archived evidence",
        "",
        "Pages superseded by a change of their federation or budget, kept with their runs; "
        "their verdicts are not counted above.",
        "",
    ]
    for readme in sets:
        heading = readme.read_text().splitlines()[0].lstrip("# ").strip()
        lines.append(f"- [{heading}](archive/{readme.parent.name}/README.md)")
    return [*lines, ""]


def _listed(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds)) or "none yet"


def _page_lines(folder: str, s: dict[str, Any], title: str) -> list[str]:
    seeds = sorted(set(s["seeds"].values()))
    lines = [
        f"### [{title}]({folder}/table.md)",
        "",
        f"Budget `{s['budget']}`; {len(s['seeds'])} of {s['rows']} rows run; seeds per row: "
        f"{_listed(seeds)}.",
        "",
    ]
    if s["claims"] and any("authors" in c for c in s["claims"]):
        lines += [
            "| claim | says | verdict | with the authors' code |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c['id']} | {c['says']} | {_verdict_cell(c)} | {_authors_cell(c)} |"
            for c in s["claims"]
        ]
        lines.append("")
    elif s["claims"]:
        lines += ["| claim | says | verdict |", "|---|---|---|"]
        lines += [f"| {c['id']} | {c['says']} | {_verdict_cell(c)} |" for c in s["claims"]]
        lines.append("")
    return lines


def _authors_cell(claim: dict[str, Any]) -> str:
    """The claim's verdict with the authors' code in place of fedseg's parity rows."""
    theirs = claim.get("authors")
    if not theirs:
        return "—"
    reason = f" ({theirs['reason']})" if theirs["verdict"] != "holds" and theirs["reason"] else ""
    return f"{theirs['verdict']}{reason}"


def _verdict_cell(claim: dict[str, Any]) -> str:
    if claim["verdict"] == PENDING:
        return f"{PENDING} ({claim['reason']})"
    return claim["verdict"]
