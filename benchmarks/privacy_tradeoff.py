"""Accuracy against epsilon: FedAvg with central DP (DP-FedAvg) at several noise levels.

Usage: python benchmarks/privacy_tradeoff.py [CONFIG] [--noise 0.01 0.1 1.0] [--clip 1.0]
       [--delta 1e-3] [--seeds 0 1 2] [--set key=value ...] [--runs DIR] [--out FILE.json]
       [--figure FILE.png]

CONFIG (default ``benchmarks/configs/faz.yaml``: synthetic FAZ phantoms, 5 sites, weak
labels) is run in-process with FedAvg once without privacy and once per noise multiplier
with ``privacy: {mode: central, clip, noise_multiplier, delta}``, for every seed. Printed and
written: per noise level the epsilon at ``delta`` after the run's rounds (dp-accounting's RDP
accountant, every site in every round), the mean foreground Dice x 100 over sites and regions
(mean and spread over the seeds), and the median update norm the sites reported before
clipping (how hard ``clip`` bites). The figure plots Dice against epsilon (log scale), the
non-private run as a line. A tiny check of the script (about 15 s on one core)::

    python benchmarks/privacy_tradeoff.py --seeds 0 --set data.synth.sites=3 \\
        --set data.synth.size=32 --set data.synth.per_site=6 --set data.root=/tmp/faz-tiny \\
        --set train.rounds=2 --set train.local_iters=2 --set train.batch_size=4 \\
        --set model.widths=[8,16,32] --set model.dropout=[0,0,0] --runs /tmp/privacy-runs

The real run (docs/privacy.md): ``python benchmarks/privacy_tradeoff.py --out
privacy_tradeoff.json --figure docs/img/privacy_tradeoff.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import RunConfig, apply_overrides, parse_config
from fedseg.configs import resolve_config
from fedseg.engine.runner import InProcessRunner

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "faz.yaml"


def config(path: Path, overrides: list[str], seed: int, privacy: dict[str, Any]) -> RunConfig:
    """CONFIG with ``overrides``, FedAvg, ``seed`` and the ``privacy`` block."""
    raw = yaml.safe_load(resolve_config(path).read_text()) or {}
    raw = apply_overrides(raw, overrides)
    raw.update(seed=seed, method={"name": "fedavg"}, privacy=privacy)
    raw.setdefault("eval", {})["save_models"] = False
    return parse_config(raw, str(path))


def foreground_dice(results: dict[str, Any]) -> float:
    """Mean Dice x 100 over the foreground regions of the site-averaged results."""
    per_region = results["average"]["dsc"]
    return 100 * statistics.fmean(per_region.values())


def median_update_norm(run: Path) -> float | None:
    """Median over sites and rounds of the update norm reported before clipping."""
    norms = [
        m["update_norm"]
        for line in (run / "rounds.jsonl").read_text().splitlines()
        for m in json.loads(line)["clients"].values()
        if "update_norm" in m
    ]
    return statistics.median(norms) if norms else None


def run_level(
    args: argparse.Namespace, runs: Path, noise: float | None, seed: int
) -> dict[str, Any]:
    """One run: no privacy (``noise`` None) or central DP at noise multiplier ``noise``."""
    privacy: dict[str, Any] = {"mode": "off"}
    if noise is not None:
        privacy = {"mode": "central", "clip": args.clip, "noise_multiplier": noise}
        privacy["delta"] = args.delta
    cfg = config(args.config, args.set, seed, privacy)
    out = runs / f"{'off' if noise is None else f'z{noise:g}'}-seed{seed}"
    t0 = time.perf_counter()
    res = InProcessRunner(cfg, out).run()
    return {
        "noise_multiplier": noise,
        "seed": seed,
        "dice": foreground_dice(res),
        "epsilon": res.get("privacy", {}).get("epsilon"),
        "update_norm": median_update_norm(out),
        "seconds": time.perf_counter() - t0,
    }


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per noise level: epsilon, Dice mean and spread over seeds, update norm."""
    out = []
    for noise in dict.fromkeys(r["noise_multiplier"] for r in rows):
        mine = [r for r in rows if r["noise_multiplier"] == noise]
        dice = [r["dice"] for r in mine]
        norms = [r["update_norm"] for r in mine if r["update_norm"] is not None]
        out.append(
            {
                "noise_multiplier": noise,
                "epsilon": mine[0]["epsilon"],
                "dice_mean": statistics.fmean(dice),
                "dice_sd": statistics.stdev(dice) if len(dice) > 1 else 0.0,
                "seeds": len(dice),
                "update_norm": statistics.median(norms) if norms else None,
            }
        )
    return out


def table(summary: list[dict[str, Any]], delta: float) -> str:
    lines = [
        f"| noise multiplier | epsilon (delta {delta:g}) | Dice x 100 (mean ± sd) | update norm |",
        "|---:|---:|---:|---:|",
    ]
    for s in summary:
        z = "no DP" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:g}"
        eps = "-" if s["epsilon"] is None else f"{s['epsilon']:.3g}"
        norm = "-" if s["update_norm"] is None else f"{s['update_norm']:.3g}"
        dice = f"{s['dice_mean']:.1f} ± {s['dice_sd']:.1f} ({s['seeds']} seeds)"
        lines.append(f"| {z} | {eps} | {dice} | {norm} |")
    return "\n".join(lines)


def figure(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    dp = [s for s in summary if s["epsilon"] is not None]
    ax.errorbar(
        [s["epsilon"] for s in dp],
        [s["dice_mean"] for s in dp],
        yerr=[s["dice_sd"] for s in dp],
        marker="o",
        capsize=3,
        label="DP-FedAvg",
    )
    for s in dp:
        ax.annotate(f"z={s['noise_multiplier']:g}", (s["epsilon"], s["dice_mean"]), fontsize=8)
    for s in summary:
        if s["epsilon"] is None:
            ax.axhline(s["dice_mean"], color="grey", linestyle="--", label="FedAvg, no DP")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("foreground Dice x 100")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs", type=Path, default=None, help="run directories (default: temp)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--figure", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp)
        rows = [
            run_level(args, runs, noise, seed)
            for noise in [None, *args.noise]
            for seed in args.seeds
        ]
    summary = summarise(rows)
    print(table(summary, args.delta))
    if args.out:
        record = {"config": str(args.config), "set": args.set, "clip": args.clip}
        record |= {"delta": args.delta, "runs": rows, "summary": summary}
        args.out.write_text(json.dumps(record, indent=2))
    if args.figure:
        figure(summary, args.figure)


if __name__ == "__main__":
    main()
