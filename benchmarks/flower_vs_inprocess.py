"""Flower on loopback against the in-process engine: start-up, and wall and CPU time per round.

Usage: python benchmarks/flower_vs_inprocess.py [--size 64] [--sites 2] [--rounds 3]
       [--local-iters 10] [--batch 8] [--per-site 24] [--method fedavg] [--workers 1]
       [--eval-every N] [--keep DIR]

Both engines run the same config (synthetic fundus federation, weak labels, CPU) with one
torch thread per training process (results then are bit-identical; torch's thread count
changes the floating-point summation order): in-process one process trains the sites one
after another (``--workers 2``: two worker processes train them at the same time); Flower
(``fedseg flower local``'s launcher) is a SuperLink and one site process per site (fedseg's
long-lived ClientApp process with its SuperNode in process isolation mode), whose sites
train at the same time when cores are free. A round's wall time is what the server's round
loop measures (``rounds.jsonl``: payloads out, replies back, server step). CPU time per
round: in-process the CPU time of the process and its workers; Flower the CPU time of every
process the launcher started and their descendants (SuperLink, ServerApp, SuperNodes, site
processes), sampled from /proc (Linux) whenever a round ends. Rounds after the first are
"steady" (the first also loads the sites' model and data). Start-up is the rest of the run
before round 1 (processes, imports, joining); the final evaluation is reported separately.
The per-site results of both engines must be identical, otherwise the script fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from fedseg.config import RunConfig, parse_config
from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels
from fedseg.engine.flower.launcher import LOCAL_SERVER_POLL, LocalFederation
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig
from fedseg.engine.runner import InProcessRunner

TICK = os.sysconf("SC_CLK_TCK")


ROLES = (
    ("flwr-serverapp", "ServerApp"),
    ("flower-superexec", "SuperExec"),
    ("flower-superlink", "SuperLink"),
    ("fedseg.engine.flower.executor", "site processes"),
    ("supernode", "SuperNodes"),
    ("flwr", "flwr run"),
)
"""Process roles by the first matching word of their command line."""


def role(cmdline: str) -> str:
    return next((name for word, name in ROLES if word in cmdline), "other")


def tree_cpu(roots: set[int]) -> dict[str, float]:
    """CPU seconds (user + system, including reaped children) of the processes ``roots``, the
    children of this process (``flwr run``) and all their descendants (Flower starts some
    helpers in sessions of their own), by role."""
    stats: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    stats[int(entry.name)] = fh.read().rpartition(")")[2].split()
            except OSError:
                continue
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)  # ppid
    roots = roots | set(children.get(os.getpid(), []))
    todo, total = [r for r in roots if r in stats], dict.fromkeys([n for _, n in ROLES], 0.0)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                name = role(fh.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            name = "other"
        ticks = sum(int(v) for v in stats[pid][11:15])  # utime, stime, cutime, cstime
        total[name] = total.get(name, 0.0) + ticks / TICK
        todo += children.get(pid, [])
    return total


def config(root: Path, args: argparse.Namespace, names: list[str]) -> RunConfig:
    return parse_config(
        {
            "name": "flower-bench",
            "seed": 0,
            "data": {"root": str(root), "labels": "weak", "sites": names},
            "method": {"name": args.method},
            "train": {
                "rounds": args.rounds,
                "local_iters": args.local_iters,
                "batch_size": args.batch,
                "optimizer": "adamw",
                "lr": 0.005,
            },
            "eval": {
                "batch_size": 32,
                **({} if args.eval_every is None else {"every": args.eval_every}),
            },
            "engine": {"device": "cpu", "threads": 1, "workers": args.workers},
        }
    )


def summary(total: float, rounds: list[dict[str, Any]], cpu: list[float], ev: float) -> dict:
    walls = [r["seconds"] for r in rounds]
    return {
        "total": total,
        "startup": total - sum(walls) - ev,
        "eval": ev,
        "round_wall": walls,
        "steady_wall": sum(walls[1:]) / max(len(walls) - 1, 1),
        "steady_cpu": sum(cpu[1:]) / max(len(cpu) - 1, 1),
    }


def in_process(cfg: RunConfig, run_dir: Path) -> tuple[dict, dict]:
    samples: list[float] = []
    t0 = time.perf_counter()

    def cpu_now(_: object) -> None:  # this process and its worker processes (--workers)
        samples.append(time.process_time() + sum(tree_cpu(set()).values()))

    res = InProcessRunner(cfg, run_dir).run(on_round=cpu_now)
    total = time.perf_counter() - t0
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    cpu = [0.0] + [b - a for a, b in itertools.pairwise(samples)]
    return summary(total, rounds, cpu, res["timing"]["eval_seconds"]), res


def flower(cfg: RunConfig, root: Path, work: Path, names: list[str]) -> tuple[dict, dict]:
    run_dir = work / "flower-run"
    sites = [SiteConfig(n, root, run_dir / "sites" / n, threads=1) for n in names]
    settings = FlowerSettings(
        run_dir=run_dir, sites=tuple(names), min_sites=len(names), poll_interval=LOCAL_SERVER_POLL
    )
    samples: list[dict[str, float]] = []
    done = threading.Event()
    t0 = time.perf_counter()
    with LocalFederation(sites, work / "fed", log_dir=run_dir / "flower-logs") as fed:
        roots = {p.pid for p in [fed.superlink, *fed._nodes] if p is not None}

        def sample_at_round_ends() -> None:
            seen = 0
            path = run_dir / "rounds.jsonl"
            while not done.is_set():
                n = path.read_text().count("\n") if path.exists() else 0
                if n > seen:
                    samples.append(tree_cpu(roots))
                    seen = n
                time.sleep(0.05)

        watcher = threading.Thread(target=sample_at_round_ends, daemon=True)
        watcher.start()
        res = fed.run(cfg, settings, timeout=600)
        done.set()
        watcher.join()
    total = time.perf_counter() - t0
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    per_role = [{k: b[k] - a.get(k, 0.0) for k in b} for a, b in itertools.pairwise(samples)]
    out = summary(
        total, rounds, [0.0] + [sum(d.values()) for d in per_role], res["timing"]["eval_seconds"]
    )
    out["roles"] = {k: sum(d[k] for d in per_role) / len(per_role) for k in per_role[0]}
    return out, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--sites", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-iters", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--per-site", type=int, default=24)
    ap.add_argument("--method", default="fedavg")
    ap.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="Periodic evaluation every N rounds (0: none; default: fedseg's, every round here)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="In-process worker processes (2: sites in parallel, like Flower's site processes)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="Keep the runs in this folder.")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (steady rounds are those after the first)")
    with tempfile.TemporaryDirectory(prefix="fedseg-bench-") as tmp:
        work = args.keep or Path(tmp)
        root = work / "data"
        synthesize("fundus", root, sites=args.sites, size=args.size, per_site=args.per_site, seed=0)
        generate_weak_labels(root, seed=0)
        names = sorted(p.name for p in (root / "sites").iterdir())
        cfg = config(root, args, names)
        ours, ref = in_process(cfg, work / "inprocess-run")
        fl, res = flower(cfg, root, work, names)
    if res["sites"] != ref["sites"]:
        raise SystemExit("per-site results differ between the engines")
    print(
        f"{args.method}, {args.sites} sites x {args.rounds} rounds, {args.size} px, "
        f"{args.local_iters} local iterations of batch {args.batch}, in-process workers "
        f"{args.workers}; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average {os.getloadavg()[0]:.1f}"
    )
    print("| | in-process | Flower (loopback) | ratio |\n|---|---:|---:|---:|")
    rows = [
        ("start-up wall (s)", "startup"),
        ("round wall, steady mean (s)", "steady_wall"),
        ("round CPU, steady mean (s)", "steady_cpu"),
        ("final evaluation wall (s)", "eval"),
        ("whole run wall (s)", "total"),
    ]
    for label, key in rows:
        print(f"| {label} | {ours[key]:.2f} | {fl[key]:.2f} | {fl[key] / ours[key]:.2f}x |")
    print("round walls (s): in-process", [f"{w:.2f}" for w in ours["round_wall"]])
    print("round walls (s): Flower    ", [f"{w:.2f}" for w in fl["round_wall"]])
    print("Flower, CPU per steady round by process (s):")
    for name, sec in fl["roles"].items():
        print(f"  {name:15s} {sec:6.2f}")
    print("per-site results identical: yes")


if __name__ == "__main__":
    main()
