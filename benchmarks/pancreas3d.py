"""Paper Table 2 on the synthetic 7-site pancreas federation: No FL, FedAvg, FedAvg+AAW.

Usage:
    python benchmarks/pancreas3d.py [--out runs/bench-pancreas3d] [--tasks pancreas3d_t1
        pancreas3d_t2] [--size 32] [--per-site 12] [--rounds 20] [--local-iters 10]
        [--model unet synergynet]

For each task (by default the T1-like and the T2-like federation, the paper's two
experiments) it synthesizes the federation (3D volumes with physical spacing, 65/15/20
train/val/test so that the two tiny sites keep a validation case), trains `local` (No FL),
`fedavg` and `fedavg_aaw` with Dice + BCE through the in-process runner, and writes into
``--out``: one run directory per (task, method), ``table2.md`` (per site and averaged over
sites weighted by test cases, as the paper, and unweighted: Dice, Jaccard, precision, recall,
HD95 and ASSD in mm) and ``aaw_weights_<task>.png`` plus the weight trajectories in the
Markdown. Everything is CPU-feasible at the defaults (16x32x32 volumes): one task took
about 10 minutes on 2 lightly loaded cores (fedavg 186 s, fedavg_aaw 201 s; local does
the same training as fedavg), so the default two tasks take about 20 minutes. Finished run
directories are reused unless ``--rerun``.

``--model`` names the backbones (``model:`` blocks with their default settings): ``unet``
(default) and/or ``synergynet`` (the paper's SynergyNet-8s2h as reconstructed in
``docs/methods/synergynet.md``); with several, the table puts them side by side. The paper's
averages, each run's parameters, wall and CPU time, and SynergyNet's codebook usage follow.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from fedseg.config import parse_config
from fedseg.data.synth import synthesize
from fedseg.data.synth.tasks.pancreas3d import TABLE1
from fedseg.engine.runner import InProcessRunner
from fedseg.outputs import write_run_outputs
from fedseg.reporting.weights_plot import load_weight_history, plot_weights

METHODS = {"local": "No FL", "fedavg": "FedAvg", "fedavg_aaw": "FedAvg+AAW"}
MODELS = {"unet": "UNet", "synergynet": "SynergyNet"}
METRICS = {
    "dsc": "Dice↑",
    "jaccard": "Jaccard↑",
    "precision": "Precision↑",
    "recall": "Recall↑",
    "hd95": "HD95↓",
    "assd": "ASSD↓",
}
REGION = "pancreas"
SPLIT = (0.65, 0.15, 0.2)
PAPER = {  # paper Table 2, "Average" block: T1W then T2W (real MRI, SynergyNet-8s2h)
    "local": (0.8223, 0.7203, 0.8507, 0.8100, 3.4022, 0.9351,
              0.8011, 0.7103, 0.8422, 0.7888, 3.8224, 0.9030),
    "fedavg": (0.6583, 0.5061, 0.5733, 0.8367, 7.9286, 1.7303,
               0.6324, 0.5034, 0.6254, 0.7140, 10.4819, 2.7442),
    "fedavg_aaw": (0.7017, 0.5593, 0.6146, 0.8554, 6.3298, 1.5523,
                   0.5870, 0.4467, 0.5697, 0.6727, 10.2151, 2.6916),
}  # fmt: skip


def run_config(
    args: argparse.Namespace, task: str, root: Path, method: str, model: str = "unet"
) -> dict[str, Any]:
    """The run configuration of one (task, method, backbone) cell, as a YAML-like mapping."""
    return {
        "name": f"{task}-{method}" + ("" if model == "unet" else f"-{model}"),
        "seed": args.seed,
        "data": {"root": str(root), "labels": "full"},
        "method": {"name": method},
        "model": {"name": model},
        "train": {
            "rounds": args.rounds,
            "local_iters": args.local_iters,
            "batch_size": args.batch_size,
            "optimizer": "adamw",
            "lr": args.lr,
            "weight_decay": 0.01,
            "lr_schedule": "poly",
            "augment": True,
            "loss": "dice_bce",
        },
        "eval": {"batch_size": args.batch_size},
        "engine": {"device": "cpu", "checkpoint_every": args.rounds},
    }


def run_dir(args: argparse.Namespace, task: str, row: str) -> Path:
    """The run directory of a table row (``method`` or ``method:model``)."""
    method, _, model = row.partition(":")
    return args.out / task / (method if model in ("", "unet") else f"{method}-{model}")


def rows(models: list[str]) -> dict[str, str]:
    """Table rows: ``method`` (one backbone) or ``method:model`` -> label."""
    if models == ["unet"]:
        return dict(METHODS)
    return {f"{m}:{b}": f"{label} ({MODELS[b]})" for m, label in METHODS.items() for b in models}


def run_task(args: argparse.Namespace, task: str) -> dict[str, dict[str, Any]]:
    """Synthesize ``task`` (once) and run the three methods with every backbone; results.json
    per row."""
    root = args.out / "data" / task
    if not (root / "manifest.json").exists():
        synthesize(task, root, size=args.size, per_site=args.per_site, seed=args.seed, split=SPLIT)
    results = {}
    for row in rows(args.model):
        method, _, model = row.partition(":")
        out = run_dir(args, task, row)
        if (out / "results.json").exists() and not args.rerun:
            results[row] = json.loads((out / "results.json").read_text())
            continue
        raw = run_config(args, task, root, method, model or "unet")
        cfg = parse_config(raw, f"{task}/{out.name}")
        t0 = time.perf_counter()
        results[row] = InProcessRunner(cfg, out).run()
        write_run_outputs(out, results[row])
        logging.info("%s %s: %.0f s", task, out.name, time.perf_counter() - t0)
    return results


def _cell(value: float, metric: str) -> str:
    return f"{value:.4f}" if metric not in ("hd95", "assd") else f"{value:.2f}"


def table2(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown laid out like the paper's Table 2: per-site blocks, the averages, and the
    paper's averages (its T1W and T2W columns face the first two tasks)."""
    tasks = list(results)
    labels = rows_of(results)
    key = next(iter(labels))
    first = results[tasks[0]][key]
    sites = list(first["sites"])
    centres = dict(zip(sites, TABLE1, strict=False))
    head = ["Method"] + [f"{t} {label}" for t in tasks for label in METRICS.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def block(title: str, pick: Any) -> None:
        lines.append(f"| **{title}** |" + " |" * (len(head) - 1))
        for row, label in labels.items():
            cells = [_cell(pick(results[t][row])[m][REGION], m) for t in tasks for m in METRICS]
            lines.append("| " + " | ".join([label, *cells]) + " |")

    for s in sites:
        n = ", ".join(f"{t}: {results[t][key]['cases'][s]} test" for t in tasks)
        block(f"Site {s} ({centres.get(s, '?')}-like; {n})", lambda r, s=s: r["sites"][s])
    block("Average (weighted by test cases, as the paper)", lambda r: r["weighted_average"])
    block("Average (unweighted over sites)", lambda r: r["average"])
    lines.append("| **Paper Table 2, Average (real MRI, T1W, T2W)** |" + " |" * (len(head) - 1))
    for method, values in PAPER.items():
        cells = [_cell(v, m) for v, m in zip(values, [*METRICS] * 2, strict=True)]
        cells = (cells + ["-"] * len(head))[: len(head) - 1]
        lines.append("| " + " | ".join([f"{METHODS[method]} (paper)", *cells]) + " |")
    return "\n".join(lines) + "\n"


def rows_of(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str]:
    """The row labels of ``results`` (in table order)."""
    row_keys = list(next(iter(results.values())))
    models = list(dict.fromkeys(k.partition(":")[2] or "unet" for k in row_keys))
    return rows(models)


def cost_table(args: argparse.Namespace, results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown: parameters, wall and CPU seconds (training + evaluation) of every run, and
    the SynergyNet codebook usage of its last round (mean over sites)."""
    lines = [
        "| Task | Run | Parameters | Wall s | CPU s | Perplexity (last round) | Dead codes |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, per in results.items():
        for row, label in rows_of(results).items():
            r, t = per[row], per[row]["timing"]
            wall = sum(t["round_seconds"]) + t["eval_seconds"]
            cpu = sum(t["round_cpu_seconds"]) + t["eval_cpu_seconds"]
            usage = codebook_usage(run_dir(args, task, row))
            vq = [f"{usage[k]:.1f}" if usage else "-" for k in ("vq_perplexity", "vq_dead_codes")]
            lines.append(
                f"| {task} | {label} | {r['params']['total']:,} | {wall:.0f} | {cpu:.0f} | "
                + " | ".join(vq)
                + " |"
            )
    return "\n".join(lines) + "\n"


def codebook_usage(run: Path) -> dict[str, float]:
    """Mean over sites of the last round's ``vq_*`` client metrics ({} without a codebook)."""
    records = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    clients = [r["clients"] for r in records if r.get("clients")][-1]
    usage = [m for m in clients.values() if "vq_perplexity" in m]
    if not usage:
        return {}
    return {k: sum(m[k] for m in usage) / len(usage) for k in ("vq_perplexity", "vq_dead_codes")}


def weight_table(run_dir: Path) -> str:
    """Markdown: AAW weight of every site at each round (the weights used to aggregate)."""
    history = load_weight_history(run_dir)
    sites = list(history)
    rounds = [r for r, _ in history[sites[0]]]
    lines = [
        "| Round | " + " | ".join(sites) + " |",
        "|" + "---|" * (len(sites) + 1),
    ]
    for i, r in enumerate(rounds):
        lines.append(f"| {r + 1} | " + " | ".join(f"{history[s][i][1]:.3f}" for s in sites) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-pancreas3d"))
    ap.add_argument("--tasks", nargs="+", default=["pancreas3d_t1", "pancreas3d_t2"])
    ap.add_argument("--size", type=int, default=32, help="H = W; depth max(16, size // 2)")
    ap.add_argument("--per-site", type=int, default=12, help="mean volumes per site")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-iters", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rerun", action="store_true", help="ignore finished run directories")
    ap.add_argument(
        "--model", nargs="+", default=["unet"], choices=list(MODELS), help="backbone(s)"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    t0 = time.perf_counter()
    results = {task: run_task(args, task) for task in args.tasks}
    parts = [
        "# Pancreas-like 3D federation: paper Table 2 layout",
        "",
        f"Synthetic 7-site federation(s) {', '.join(args.tasks)} at "
        f"{max(16, args.size // 2)}x{args.size}x{args.size} voxels, {args.per_site} volumes "
        f"per site on average (sizes as paper Table 1), split {SPLIT} train/val/test; "
        f"{args.rounds} rounds x {args.local_iters} local AdamW steps (batch {args.batch_size}, "
        f"lr {args.lr}, wd 0.01, poly decay), Dice + BCE, seed {args.seed}. HD95 and ASSD in "
        f"mm (physical voxel spacing). Backbones: {', '.join(args.model)}. Total time "
        f"{time.perf_counter() - t0:.0f} s.",
        "",
        table2(results),
        "## Cost and codebook usage",
        "",
        cost_table(args, results),
    ]
    for task in args.tasks:
        for row in rows(args.model):
            if not row.startswith("fedavg_aaw"):
                continue
            out = run_dir(args, task, row)
            name = f"aaw_weights_{task}" + ("" if out.name == "fedavg_aaw" else f"_{out.name}")
            png = plot_weights(out, args.out / f"{name}.png", title=f"AAW, {task}, {out.name}")
            parts += [f"## AAW weights, {task}, {out.name} ({png.name})", "", weight_table(out)]
    out = args.out / "table2.md"
    out.write_text("\n".join(parts))
    print(out.read_text())


if __name__ == "__main__":
    main()
