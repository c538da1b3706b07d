"""FedBCS Table 2, Table 3, the tau sweep (Fig. 3) and Fig. 4b at wave2_tables' budget.

The rows run exactly as ``benchmarks/wave2_tables.py`` runs Table 1 (its ``run_jobs``: one
``fedseg reproduce`` process per row, ``--budget smoke`` plus its ``BUDGET``, wall and CPU
time measured per process) into ``OUT/fedbcs-<table>/<row>``. Fig. 4b's input-level arm is
not a paper-table row, so its shipped config is run here at the same budget through the
same library calls ``fedseg reproduce`` makes. A row whose config and budget are identical to
a row of another table is read from that row's folder instead of being run again (``REUSE``).
Prints the markdown tables of docs/benchmarks_fedbcs.md and writes the tau figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml
from wave2_tables import BUDGET, Job, _results, _timing, run_jobs

from fedseg.configs import resolve_config
from fedseg.reproduce import BUDGETS, load_paper, run_config
from fedseg.reproduce.harness import apply_budget

TABLES = ["table2-prostate", "table2-nuclei", "table3", "tau-prostate", "tau-nuclei"]
REUSE = {("table3", "FedBCS"): ("table2-prostate", "CDPA + FSR")}
"""(table, row) -> (table, row) with the identical config, read instead of run again."""
FIG4B_CONFIG = "fedbcs/fedbcs_nuclei_fig4b_ampnorm"
FIG4B = [
    ("FedAvg", "table2-nuclei", "none (FedAvg)"),
    ("FedAvg + FSR (in the network)", "table2-nuclei", "FSR"),
    ("FedAvg + input amplitude normalisation", None, FIG4B_CONFIG),
]
BASE = {"tau-prostate": "table2-prostate", "tau-nuclei": "table2-nuclei"}
"""The tau sweep's "Base" (FedAvg) line: the first row of the same federation's Table 2."""


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def _folder(out: Path, table: str, label: str) -> Path:
    return out / f"fedbcs-{table}" / _slug(label)


def table_jobs(out: Path, table: str) -> list[Job]:
    """The rows of ``table``, each pointing at its own folder or at the row it reuses."""
    jobs = []
    for i, row in enumerate(load_paper("fedbcs").tables[table].rows, start=1):
        src = REUSE.get((table, row.label), (table, row.label))
        jobs.append(Job("fedbcs", table, i, row.label, _folder(out, *src)))
    return jobs


def fig4b_jobs(out: Path) -> list[Job]:
    """Fig. 4b's three arms; the first two are Table 2 (nuclei) rows."""
    return [
        Job("fedbcs", "fig4b-nuclei", i, label, _folder(out, src or "fig4b-nuclei", row))
        for i, (label, src, row) in enumerate(FIG4B, start=1)
    ]


def run_child(config: str, run_dir: Path) -> None:
    """Run a shipped config as ``fedseg reproduce --budget smoke`` runs a row, plus BUDGET."""
    path = resolve_config(config)
    raw = yaml.safe_load(path.read_text()) or {}
    run_config(apply_budget(raw, "smoke", BUDGETS["smoke"], then=BUDGET), run_dir, str(path))


def run_config_job(job: Job, config: str) -> None:
    """``run_child`` in its own process, timed like wave2_tables' rows (timing.json)."""
    job.out.mkdir(parents=True, exist_ok=True)
    run_dir = job.out / _slug(Path(config).name) / "seed0"
    cmd = [sys.executable, __file__, "--child", config, "--run-dir", str(run_dir)]
    with (job.out / "log.txt").open("w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        _, status, usage = os.wait4(proc.pid, 0)
    job.wall = time.perf_counter() - start
    job.cpu = usage.ru_utime + usage.ru_stime
    job.rc = os.waitstatus_to_exitcode(status)
    timing = {"wall": job.wall, "cpu": job.cpu, "rc": job.rc}
    (job.out / "timing.json").write_text(json.dumps(timing))
    print(f"fig4b {job.label}: rc {job.rc}, {job.wall:.0f} s wall, {job.cpu:.0f} s CPU")


def site_dsc(res: dict) -> dict[str, float]:
    """Foreground Dice x 100 per site (mean over the foreground regions)."""
    return {s: sum(m["dsc"].values()) / len(m["dsc"]) * 100 for s, m in res["sites"].items()}


def _avg(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def _times(job: Job) -> list[str]:
    tim = _timing(job)
    return [f"{tim.get('wall', float('nan')):.0f}", f"{tim.get('cpu', float('nan')):.0f}"]


def _markdown(title: str, head: list[str], lines: list[list[str]]) -> str:
    top = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(top + ["| " + " | ".join(cells) + " |" for cells in lines])


def dsc_table(title: str, jobs: list[Job], base: Job, published: list[float | None]) -> str:
    """Per-site DSC, average, difference to ``base`` (ours and the paper's), times."""
    base_res = _results(base)
    base_avg = _avg(site_dsc(base_res)) if base_res else float("nan")
    sites: list[str] = []
    lines = []
    paper_base = published[0] if published else None
    for job, paper in zip(jobs, published, strict=True):
        res = _results(job)
        if res is None:
            lines.append([job.label, "not run"])
            continue
        dsc = site_dsc(res)
        sites = list(dsc)
        avg = _avg(dsc)
        cells = [job.label, *(f"{v:.2f}" for v in dsc.values()), f"{avg:.2f}"]
        cells.append(f"{avg - base_avg:+.2f}")
        if paper_base is not None:
            cells += [f"{paper:.2f}", f"{paper - paper_base:+.2f}"]
        lines.append(cells + _times(job))
    head = ["row", *(f"DSC {s}" for s in sites), "DSC avg", "Δ vs FedAvg"]
    if paper_base is not None:
        head += ["paper AVG DSC", "paper Δ"]
    return _markdown(title, [*head, "wall s", "CPU s"], lines)


def _rounds(job: Job) -> list[dict]:
    found = sorted(job.out.glob("*/seed*/rounds.jsonl"))
    return [json.loads(line) for line in found[0].read_text().splitlines()] if found else []


def table3(jobs: list[Job]) -> str:
    """Prototypes per client and round (fedseg's ``prototypes`` client metric), traffic per
    client and round (``comm``: values of the upload beyond the weights, MB up and down), DSC."""
    spec = load_paper("fedbcs").tables["table3"]
    lines, per_site = [], []
    for job, row in zip(jobs, spec.rows, strict=True):
        res, rounds = _results(job), _rounds(job)
        if res is None:
            lines.append([job.label, "not run"])
            continue
        sites = list(res["sites"])
        counts = {s: [r["clients"][s]["prototypes"] for r in rounds] for s in sites}
        mean = {s: sum(v) / len(v) for s, v in counts.items()}
        per_site.append([job.label, *(f"{mean[s]:.2f}" for s in sites)])
        comm = res["communication"]
        extra = comm["upload_values_per_site_round"] - res["params"]["upload"]
        low, high = min(min(v) for v in counts.values()), max(max(v) for v in counts.values())
        lines.append(
            [
                job.label + (" ¹" if (spec.name, job.label) in REUSE else ""),
                f"{_avg(mean):.2f}",
                f"{low:g}–{high:g}",
                f"{row.published[0]:.2f}",
                f"{extra:,.0f}",
                f"{comm['upload_bytes_per_site_round'] / 1e6:.3f}",
                f"{comm['download_bytes_per_site_round'] / 1e6:.3f}",
                f"{_avg(site_dsc(res)):.2f}",
                f"{row.published[1]:.2f}",
                *_times(job),
            ]
        )
    head = [
        "row",
        "prototypes / client / round (mean)",
        "range (any client, any round)",
        "paper prototypes",
        "prototype values uploaded / client / round",
        "upload MB / client / round",
        "download MB / client / round",
        "DSC avg",
        "paper AVG DSC",
        "wall s",
        "CPU s",
    ]
    sites = list(_results(jobs[0])["sites"]) if _results(jobs[0]) else []
    text = _markdown(spec.title, head, lines)
    return (
        text
        + "\n\n"
        + _markdown(
            "Table 3, per client: mean prototypes uploaded per round (ours)",
            ["row", *sites],
            per_site,
        )
    )


def tau_figure(tables: dict[str, list[Job]], bases: dict[str, Job], path: Path) -> None:
    """DSC (average over sites) against tau, one panel per federation, FedAvg dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = {"tau-prostate": 0.4, "tau-nuclei": 0.005}
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 3.4))
    for ax, (table, jobs) in zip(axes, tables.items(), strict=True):
        points = [
            (float(j.label.split("=")[1]), _avg(site_dsc(r)))
            for j in jobs
            if (r := _results(j)) is not None
        ]
        if points:
            ax.plot(*zip(*points, strict=True), "o-", label="FedBCS")
        if (base := _results(bases[table])) is not None:
            ax.axhline(_avg(site_dsc(base)), ls="--", color="grey", label="Base (FedAvg)")
        ax.axvline(best[table], ls=":", color="tab:red", label=f"paper's best τ={best[table]}")
        ax.set_xscale("log")
        ax.set_xlabel("τ")
        ax.set_ylabel("DSC avg (%)")
        ax.set_title(table.replace("tau-", "") + " (synthetic, 6 rounds × 6 steps)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(out: Path) -> str:
    """All tables (rows not run yet say so)."""
    paper = load_paper("fedbcs")
    parts = []
    for table in ("table2-prostate", "table2-nuclei"):
        jobs = table_jobs(out, table)
        published = [r.published[0] for r in paper.tables[table].rows]
        parts.append(dsc_table(paper.tables[table].title, jobs, jobs[0], published))
    parts.append(table3(table_jobs(out, "table3")))
    for table in ("tau-prostate", "tau-nuclei"):
        jobs = table_jobs(out, table)
        base = table_jobs(out, BASE[table])[0]
        parts.append(dsc_table(paper.tables[table].title, jobs, base, [None] * len(jobs)))
    fig4b = fig4b_jobs(out)
    title = "Fig. 4b: FSR vs input-level amplitude normalisation on FedAvg, nuclei"
    parts.append(dsc_table(title, fig4b, fig4b[0], [None] * len(fig4b)))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    """Run the chosen tables' rows that have not succeeded yet, then render everything."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/fedbcs-tables"))
    parser.add_argument("--table", action="append", choices=[*TABLES, "fig4b"], default=[])
    parser.add_argument("--row", action="append", help="only these row labels (default: all)")
    parser.add_argument("--figure", type=Path, default=Path("docs/img/fedbcs_tau.png"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child, args.run_dir)
        return
    for table in args.table:
        if table == "fig4b":
            job = fig4b_jobs(args.out)[-1]
            if _timing(job).get("rc") != 0:
                run_config_job(job, FIG4B_CONFIG)
            continue
        jobs = [
            j
            for j in table_jobs(args.out, table)
            if (table, j.label) not in REUSE
            and (not args.row or j.label in args.row)
            and _timing(j).get("rc") != 0
        ]
        run_jobs(jobs, 1)
    tau = {t: table_jobs(args.out, t) for t in ("tau-prostate", "tau-nuclei")}
    tau_figure(tau, {t: table_jobs(args.out, BASE[t])[0] for t in tau}, args.figure)
    print(render(args.out))


if __name__ == "__main__":
    main()
