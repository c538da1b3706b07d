"""Privacy-utility study: Dice against epsilon for central and local DP, one point per call.

Usage: python benchmarks/privacy_utility.py --mode {off,central,local} --sites N
       --per-site K [--noise Z] [--clip C] [--seed S] [--settings narrow,decoder,...]
       [--rounds R] [--local-iters L] [--size PX] [--batch B] [--lr LR]
       [--optimizer {adamw,sgd}] [--out DIR]
       [--work DIR] [--device DEV]
       python benchmarks/privacy_utility.py --grid FILE [--jobs N] [--deadline S] [--device DEV]
       python benchmarks/privacy_utility.py --summary [--out DIR] [--figure FILE.png]

A point is FedAvg on a synthetic FAZ federation of N sites with K images each (full labels,
equal site sizes, train/validation/test 0.7/0.1/0.2 per site), the UNet with group norm
(BatchNorm cannot run under local DP and its statistics would be noised under central DP),
in-process, at ``delta`` = DELTA (fixed for every point). ``--settings`` adds, comma
separated, the settings under which DP is known to work better:

- ``narrow``: widths 8, 16, 32, 64 instead of 16 .. 256 (about 16 x fewer parameters);
- ``decoder``: the network starts from a model trained without DP on another federation
  (the same task and shape, synthesised with another seed; cached under the ``--work``
  folder, default data/privacy-utility, with the federations and run folders) and
  only the decoder trains (``privacy.init_from`` + ``freeze: [encoder.*]``);
- ``momentum``: server momentum 0.9 (central only);
- ``adaptive``: adaptive clipping to the median update norm (central only; ``--clip`` is
  the start).

Each point is written as DIR/<key>.json (default DIR: docs/evidence/privacy/utility) and an
existing point is not run again, so the grid fills up over several sessions. ``--summary``
prints the points as a table (Dice x 100, epsilon, and Dice as a share of the point without
DP with the same federation, settings and seed) and writes DIR/table.md; ``--figure`` plots
that share against epsilon for the full-size points. The grid of
docs/privacy.md: sites 5, 20, 100; K 50, 200; central z in 0.5 .. 5; local z in 0.5 .. 2;
2 seeds where affordable.

``--grid FILE`` runs many points at once (for a GPU machine: each point is a process, and a
small network leaves the GPU idle between kernel launches, so several processes share it):
one point per line of FILE (its arguments, e.g. ``--mode central --noise 2 --sites 100``;
``#`` starts a comment), started in the file's order, ``--jobs`` at a time. Each point's
federation is synthesised first, once, before any point starts (points that share one
would otherwise race to write it; the pre-training run that ``decoder`` points share is
made then too, for the same reason). No point starts after ``--deadline`` seconds and a
point still running then is stopped, so that a time-limited machine returns what finished.
A point records the device it ran on (``--device``, default ``cpu``): GPU kernels round
differently, so a point repeats exactly on the same kind of device only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import cv2

from fedseg.config import parse_config
from fedseg.engine.prepare import prepare_data
from fedseg.engine.rundir import RunDir
from fedseg.engine.runner import InProcessRunner
from fedseg.reproduce.runs import interrupted_run

DELTA = 1e-4
"""The delta of every point's epsilon."""
DEFAULT_LR = 0.005
LOCAL_TRAINING = ("sgd", 0.2)
"""DP-SGD's optimiser and lr for the figure's local DP lines: chosen by the rule stated in
benchmarks/configs/privacy_grid_cpu.txt (lowest last-round training loss, 5 sites, seed 0)."""
OUT = Path(__file__).parents[1] / "docs" / "evidence" / "privacy" / "utility"
SETTINGS = ("narrow", "decoder", "momentum", "adaptive")
WIDTHS = {"base": [16, 32, 64, 128, 256], "narrow": [8, 16, 32, 64]}


def point_key(args: argparse.Namespace) -> str:
    """The file name of a point (every argument that changes its result; the device where it
    is not the CPU, whose kernels round otherwise and whose OpenCV may draw otherwise)."""
    z = "" if args.mode == "off" else f"-z{args.noise:g}-c{args.clip:g}"
    tag = "+".join(sorted(args.settings)) or "base"
    shape = f"r{args.rounds}x{args.local_iters}-px{args.size}-b{args.batch}-lr{args.lr:g}"
    if args.optimizer != "adamw":
        shape += f"-{args.optimizer}"
    where = "" if args.device == "cpu" else f"-{args.device.replace(':', '')}"
    return f"{args.mode}{z}-s{args.sites}-n{args.per_site}-{tag}-{shape}-seed{args.seed}{where}"


def run_config(args: argparse.Namespace, data_seed: int, privacy: dict[str, Any]) -> Any:
    widths = WIDTHS["narrow" if "narrow" in args.settings else "base"]
    data = {
        "root": str(args.work / f"faz-s{args.sites}-n{args.per_site}-px{args.size}-d{data_seed}"),
        "labels": "full",
        "synth": {
            "task": "faz",
            "sites": args.sites,
            "size": args.size,
            "per_site": args.per_site,
            "site_weights": [1.0] * args.sites,
            "weak_labels": False,
            "seed": data_seed,
        },
    }
    return parse_config(
        {
            "seed": args.seed,
            "data": data,
            "method": {"name": "fedavg"},
            "model": {
                "name": "unet",
                "widths": widths,
                "dropout": [0.0] * len(widths),
                "norm": "group",
            },
            "train": {
                "rounds": args.rounds,
                "local_iters": args.local_iters,
                "batch_size": args.batch,
                "lr": args.lr,
                "optimizer": args.optimizer,
                "augment": False,
            },
            "eval": {"every": 0, "save_models": False},
            "engine": {"device": args.device},
            "privacy": privacy,
        }
    )


def pretrain_dir(args: argparse.Namespace) -> Path:
    """Where the pre-training run of a ``decoder`` point lives (shared by its points)."""
    narrow = [s for s in args.settings if s == "narrow"]
    key = point_key(argparse.Namespace(**{**vars(args), "mode": "off", "settings": narrow}))
    return args.work / "pretrain" / key


def pretrained(args: argparse.Namespace) -> Path:
    """A run without DP on another federation (data seed 1), the start of ``decoder``."""
    run = pretrain_dir(args)
    if not (run / "checkpoints" / "last.pt").is_file():
        InProcessRunner(run_config(args, 1, {"mode": "off"}), run).run()
    return run


def privacy_block(args: argparse.Namespace) -> dict[str, Any]:
    block: dict[str, Any] = {"mode": args.mode}
    if args.mode != "off":
        block |= {"clip": args.clip, "noise_multiplier": args.noise, "delta": DELTA}
    if "momentum" in args.settings:
        block["server_momentum"] = 0.9
    if "adaptive" in args.settings:
        block["adaptive_clip"] = {"quantile": 0.5, "learning_rate": 0.2}
    if "decoder" in args.settings:
        block |= {"init_from": str(pretrained(args)), "freeze": ["encoder.*"]}
    return block


def run_point(args: argparse.Namespace) -> dict[str, Any]:
    cfg = run_config(args, 0, privacy_block(args))
    run = args.work / "runs" / point_key(args)
    # a point stopped part-way (a deadline, a session's end) continues from its last
    # checkpointed round, as the reproduce harness continues its runs; anything else there
    # (no checkpoint, other settings) is replaced
    resume = interrupted_run(run, cfg)
    if not resume:
        RunDir(run).prepare_new(overwrite=True)
    t0 = time.perf_counter()
    res = InProcessRunner(cfg, run).run(resume=resume)
    dice = 100 * statistics.fmean(res["average"]["dsc"].values())
    last = RunDir(run).rounds()[-1]["clients"]
    return {
        "key": point_key(args),
        "mode": args.mode,
        "sites": args.sites,
        "per_site": args.per_site,
        "noise_multiplier": None if args.mode == "off" else args.noise,
        "clip": None if args.mode == "off" else args.clip,
        "settings": sorted(args.settings),
        "seed": args.seed,
        "rounds": args.rounds,
        "local_iters": args.local_iters,
        "size": args.size,
        "batch": args.batch,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "delta": DELTA,
        "epsilon": res.get("privacy", {}).get("epsilon"),
        "dice": dice,
        # what every site reports each round: the rule that picks DP-SGD's training uses it
        "last_train_loss": statistics.fmean(c["loss"] for c in last.values()),
        "device": args.device,
        "opencv": cv2.__version__,
        "seconds": time.perf_counter() - t0,
        "resumed": resume,  # then ``seconds`` counts the rounds after the checkpoint only
    }


def _tuned(r: dict[str, Any]) -> str:
    """A point's training where it is not the study's default (AdamW at DEFAULT_LR), else ''."""
    if (r["optimizer"], r["lr"]) == ("adamw", DEFAULT_LR):
        return ""
    return f"{r['optimizer']} lr {r['lr']:g}"


def _group(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a point's no-DP reference shares with it: federation, schedule, seed, network."""
    shape = ("sites", "per_site", "rounds", "local_iters", "size", "batch", "seed")
    net = tuple(s for s in r["settings"] if s in ("narrow", "decoder"))
    # where it ran: the federation is drawn there (OpenCV's drawing changes between versions;
    # the CPU points before 2026-12-04 recorded neither) and the kernels round there
    machine = (r.get("device", "cpu"), r.get("opencv"))
    return (*(r[k] for k in shape), net, machine)


def load_points(out: Path) -> list[dict[str, Any]]:
    """The measured points, each with ``share``: its Dice over its no-DP reference's, the
    point without DP at the default training (AdamW, DEFAULT_LR) on the same federation,
    network and seed (None for the references themselves and where it is not measured)."""
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    for r in rows:  # the points before 2026-12-04 ran AdamW at the default lr
        r.setdefault("optimizer", "adamw")
        r.setdefault("lr", DEFAULT_LR)
    base = {_group(r): r["dice"] for r in rows if r["mode"] == "off" and not _tuned(r)}
    for r in rows:
        ref = base.get(_group(r))
        r["share"] = r["dice"] / ref if ref and r["mode"] != "off" else None
    return rows


def summary(out: Path) -> str:
    """The measured points as a markdown table."""
    rows = load_points(out)
    lines = [
        f"| mode | sites | images per site | settings | z | epsilon (delta {DELTA:g}) "
        "| Dice x 100 | share of no-DP Dice | rounds x steps of batch, px, seed | device |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["sites"], r["per_site"], r["mode"], r["key"])):
        share = "-" if r["share"] is None else f"{r['share']:.0%}"
        eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        z = "-" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:g}"
        lines.append(
            f"| {r['mode']} | {r['sites']} | {r['per_site']} | "
            f"{', '.join(filter(None, ['+'.join(r['settings']) or 'base', _tuned(r)]))}"
            f" | {z} | {eps} | {r['dice']:.1f} | {share} | {r['rounds']} x {r['local_iters']} of "
            f"{r['batch']}, "
            f"{r['size']}, {r['seed']} | {r.get('device', 'cpu')} |"
        )
    return "\n".join(lines)


def figure(out: Path, path: Path) -> None:
    """Share of the no-DP Dice against epsilon, a line per mode, number of sites and start: the
    full-size points (K 200, 48 px, 25 x 8 steps of 8, narrow network, alone or with
    ``decoder``), central DP at the default training and local DP at LOCAL_TRAINING; a marker
    per seed and device, the line through the mean share at each z."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = {
        "per_site": 200,
        "size": 48,
        "rounds": 25,
        "local_iters": 8,
        "batch": 8,
    }
    training = {"central": ("adamw", DEFAULT_LR), "local": LOCAL_TRAINING}
    rows = [
        r
        for r in load_points(out)
        if r["share"] is not None
        and all(r[k] == v for k, v in full.items())
        and sorted(r["settings"]) in (["narrow"], ["decoder", "narrow"])
        and (r["optimizer"], r["lr"]) == training[r["mode"]]
    ]
    if not rows:
        raise SystemExit(f"--figure: no full-size point with a no-DP reference under {out}")
    fig, ax = plt.subplots(figsize=(8, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sizes = sorted({r["sites"] for r in rows})

    def series(r: dict[str, Any]) -> tuple[str, int, bool]:
        return r["mode"], r["sites"], "decoder" in r["settings"]

    for mode, sites, pretrained_start in sorted({series(r) for r in rows}):
        colour = colours[sizes.index(sites) % len(colours)]
        mine = [r for r in rows if series(r) == (mode, sites, pretrained_start)]
        marker = "^" if pretrained_start else "o" if mode == "central" else "s"
        ax.scatter(
            [r["epsilon"] for r in mine],
            [100 * r["share"] for r in mine],
            color=colour,
            marker=marker,
            alpha=0.5,
        )
        by_z: dict[float, list[dict[str, Any]]] = {}
        for r in mine:
            by_z.setdefault(r["noise_multiplier"], []).append(r)
        line = sorted(
            (d[0]["epsilon"], 100 * statistics.fmean(r["share"] for r in d)) for d in by_z.values()
        )
        kind = "central DP, per site" if mode == "central" else "local DP-SGD, per example"
        kind += ", pre-trained encoder" if pretrained_start else ""
        ax.plot(
            *zip(*line, strict=True),
            color=colour,
            linestyle=":" if pretrained_start else "-" if mode == "central" else "--",
            marker=marker,
            label=f"{kind}, {sites} sites",
        )
    ax.axhline(80, color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(10, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xticks([2, 5, 10, 20, 40], ["2", "5", "10", "20", "40"])
    ax.minorticks_off()
    ax.set_xlabel(f"epsilon (delta {DELTA:g})")
    ax.set_ylabel("Dice, % of the same run without DP")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def run_grid(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Run the points listed in ``args.grid``, ``args.jobs`` at a time, until the deadline."""
    start = time.monotonic()
    lines = [ln.split("#")[0].strip() for ln in args.grid.read_text().splitlines()]
    common = ["--out", str(args.out), "--work", str(args.work), "--device", args.device]
    points = [shlex.split(ln) + common for ln in lines if ln]
    parsed = [ap.parse_args(p) for p in points]
    for i, p in enumerate(parsed, 1):
        if p.grid or p.summary or p.mode is None:
            ap.error(f"{args.grid} point {i}: needs --mode, and no --grid or --summary")
    feds = {(p.sites, p.per_site, p.size): p for p in parsed}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(prepare_data, [run_config(p, 0, {"mode": "off"}) for p in feds.values()]))
    print(f"grid: {len(points)} points, federations ready after {time.monotonic() - start:.0f} s")
    # decoder points share a pre-training run: made here, once, so parallel points never race
    starts = {pretrain_dir(p): p for p in parsed if "decoder" in p.settings}
    for p in starts.values():
        pretrained(p)
    if starts:
        print(f"grid: {len(starts)} pre-training runs ready after {time.monotonic() - start:.0f} s")
    queue, running = list(points), []
    while queue or running:
        for proc, point in [r for r in running if r[0].poll() is not None]:
            running.remove((proc, point))
            status = "done" if proc.returncode == 0 else f"FAILED ({proc.returncode})"
            what = shlex.join(point[: -len(common)])
            print(f"grid: {time.monotonic() - start:.0f} s {status}: {what}")
        if time.monotonic() - start > args.deadline:
            for proc, _ in running:
                proc.terminate()
            print(f"grid: deadline; {len(running)} stopped, {len(queue)} not started")
            return
        while queue and len(running) < args.jobs:
            point = queue.pop(0)
            cmd = [sys.executable, __file__, *point]
            running.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL), point))
        time.sleep(1)
    print(f"grid: all points done in {time.monotonic() - start:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("off", "central", "local"))
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--per-site", type=int, default=200)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", type=lambda s: [x for x in s.split(",") if x], default=[])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--local-iters", type=int, default=8)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=DEFAULT_LR)
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--work", type=Path, default=Path("data/privacy-utility"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--grid", type=Path)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--deadline", type=float, default=float("inf"))
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--figure", type=Path, help="with --summary: plot share against epsilon")
    args = ap.parse_args()
    if args.figure and not args.summary:
        ap.error("--figure goes with --summary")
    if args.grid:
        run_grid(ap, args)
        return
    if args.summary:
        if not any(args.out.glob("*.json")):
            ap.error(f"--summary: no measured point under {args.out}")
        table = summary(args.out)
        print(table)
        (args.out / "table.md").write_text(table + "\n")
        if args.figure:
            figure(args.out, args.figure)
        return
    if args.mode is None:
        ap.error("--mode is needed (or --summary)")
    if bad := [s for s in args.settings if s not in SETTINGS]:
        ap.error(f"--settings: unknown {bad}; choose from {', '.join(SETTINGS)}")
    if args.mode != "central" and {"momentum", "adaptive"} & set(args.settings):
        ap.error("--settings momentum and adaptive need --mode central")
    file = args.out / f"{point_key(args)}.json"
    if file.is_file():
        print(f"{file}: already measured")
        return
    point = run_point(args)
    args.out.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(point, indent=2) + "\n")
    print(json.dumps(point, indent=2))


if __name__ == "__main__":
    main()
