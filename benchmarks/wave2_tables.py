"""FedBCS Table 1 and the virtual-class paper's Table I at one small CPU budget.

Every row of each table runs through ``fedseg reproduce`` (its own output folder per row) with
the same budget (``BUDGET``), at most ``--jobs`` processes at a time; the wall time and the CPU
time of each process are measured here, and the per-site numbers are read from the row's
``results.json``. The first row of a table runs alone, so the synthetic federation is written
once before rows that share it start. Prints the markdown tables of docs/benchmarks_wave2.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedseg.reproduce.papers import load_paper

BUDGET = ["train.rounds=6", "train.local_iters=6", "train.batch_size=4"]
TABLES = [
    ("fedbcs", "table1-prostate"),
    ("vc", "table1-fundus"),
    ("fedbcs", "table1-nuclei"),
]


@dataclass
class Job:
    """One row of one table."""

    paper: str
    table: str
    index: int
    label: str
    out: Path
    wall: float = 0.0
    cpu: float = 0.0
    rc: int | None = None


def _command(job: Job) -> list[str]:
    exe = str(Path(sys.executable).with_name("fedseg"))
    cmd = [exe, "reproduce", job.paper, job.table, "--budget", "smoke", "--row", str(job.index)]
    for item in BUDGET:
        cmd += ["--set", item]
    return [*cmd, "--out", str(job.out)]


def run_jobs(jobs: list[Job], parallel: int) -> None:
    """Run the jobs, ``parallel`` at a time; the first row of a table before its others."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pending = list(jobs)
    running: dict[int, tuple[Job, float, object]] = {}
    done_first = {(j.paper, j.table) for j in jobs} - {
        (j.paper, j.table) for j in jobs if j.index == 1
    }
    while pending or running:
        for job in list(pending):
            if len(running) >= parallel:
                break
            key = (job.paper, job.table)
            if job.index != 1 and key not in done_first:
                continue
            if job.index == 1 and any(
                j.paper == job.paper and j.table == job.table for j, _, _ in running.values()
            ):
                continue
            job.out.mkdir(parents=True, exist_ok=True)
            log = (job.out / "log.txt").open("w")
            proc = subprocess.Popen(_command(job), stdout=log, stderr=subprocess.STDOUT, env=env)
            running[proc.pid] = (job, time.perf_counter(), log)
            pending.remove(job)
        if not running:
            break
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        job, start, log = running.pop(pid)
        log.close()  # type: ignore[attr-defined]
        job.wall = time.perf_counter() - start
        job.cpu = usage.ru_utime + usage.ru_stime
        job.rc = os.waitstatus_to_exitcode(status)
        (job.out / "timing.json").write_text(
            json.dumps({"wall": job.wall, "cpu": job.cpu, "rc": job.rc})
        )
        done_first.add((job.paper, job.table))
        print(
            f"{job.paper} {job.table} {job.label}: rc {job.rc},",
            f"{job.wall:.0f} s wall, {job.cpu:.0f} s CPU",
            flush=True,
        )


def _results(job: Job) -> dict | None:
    found = sorted(job.out.glob("*/seed*/results.json"))
    return json.loads(found[0].read_text()) if found else None


def _timing(job: Job) -> dict:
    path = job.out / "timing.json"
    return json.loads(path.read_text()) if path.exists() else {}


def render(jobs: list[Job]) -> str:
    """Markdown tables: per-site numbers, average, the paper's average, wall and CPU time."""
    parts: list[str] = []
    for paper, table in dict.fromkeys((j.paper, j.table) for j in jobs):
        rows = [j for j in jobs if j.paper == paper and j.table == table]
        spec = load_paper(paper).tables[table]
        sites: list[str] = []
        for job in rows:
            res = _results(job)
            if res:
                sites = list(res["sites"])
                break
        vc = paper == "vc"
        metrics = ["jaccard", "hd"] if vc else ["dsc"]
        names = {"jaccard": "mIoU", "hd": "HD", "dsc": "DSC"}
        head = ["row"]
        for m in metrics:
            head += [f"{names[m]} {s}" for s in sites] + [f"{names[m]} avg"]
        head += [f"paper {c}" for c in spec.columns] + ["wall s", "CPU s"]
        lines = [f"### {spec.title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for job in rows:
            res, tim = _results(job), _timing(job)
            published = list(spec.rows[job.index - 1].published)
            cells = [job.label]
            if res is None:
                state = "not run" if not tim else f"failed (rc {tim['rc']})"
                cells += [state] * (len(head) - 1 - len(published) - 2)
            else:
                for m in metrics:
                    scale = 100.0 if m in ("dsc", "jaccard") else 1.0
                    per_site = [
                        sum(res["sites"][s][m].values()) / len(res["sites"][s][m]) * scale
                        for s in sites
                    ]
                    cells += [f"{v:.2f}" for v in per_site] + [
                        f"{sum(per_site) / len(per_site):.2f}"
                    ]
            cells += ["—" if p is None else f"{p:.2f}" for p in published]
            cells += [f"{tim.get('wall', float('nan')):.0f}", f"{tim.get('cpu', float('nan')):.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    """Run the tables (or only render them with --render) and print the markdown."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/wave2"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--table", action="append", help="paper:table (default: all three)")
    parser.add_argument("--render", action="store_true", help="only render finished rows")
    # rows whose timing.json records success are not run again (a rerun finishes failed rows)
    args = parser.parse_args()
    chosen = [tuple(t.split(":")) for t in args.table] if args.table else TABLES
    jobs = []
    for paper, table in chosen:
        spec = load_paper(paper).tables[table]
        for i, row in enumerate(spec.rows, start=1):
            folder = re.sub(r"[^a-z0-9]+", "-", row.label.lower()).strip("-")
            jobs.append(Job(paper, table, i, row.label, args.out / f"{paper}-{table}" / folder))
    if not args.render:
        run_jobs([j for j in jobs if _timing(j).get("rc") != 0], args.jobs)
    print(render(jobs))


if __name__ == "__main__":
    main()
