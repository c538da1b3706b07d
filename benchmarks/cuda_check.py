"""Every registered method on a GPU: two rounds and an evaluation on a toy federation per
precision, the same on the CPU beside it, and the wall time of each.

Usage (on a machine with CUDA): python benchmarks/cuda_check.py [--device cuda]
    [--precisions off bf16 fp16] [--methods fedavg ...] [--out cuda_check.json]

A cell passes when the two rounds finish with finite client metrics and the evaluation's DSC
lies in [0, 1]. The CPU column (float32) is the reference a reader compares the GPU's DSC
with: two rounds on 8 images say nothing about accuracy, so a gap is a lead, not a failure.
Prints a markdown table; ``--out`` also writes the cells as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from pathlib import Path

import torch

from fedseg.engine.device import machine, resolve_device
from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method, list_methods
from fedseg.methods.training import Precision
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=3, batch_size=4, augment=False)


def check(name: str, device: torch.device, amp: str) -> dict[str, object]:
    """Two rounds of ``name`` on a three-site toy federation under ``amp`` on ``device``."""
    spec, sites = toy_federation(
        3, with_val=True, labels="full" if name == "centralized" else "weak"
    )
    cls = get_method(name)
    start = time.perf_counter()
    try:
        method = cls(cls.Config(), Simulation.method_spec(cls, spec, sites))
        sim = Simulation(method, sites, TRAIN, seed=0, device=device, precision=Precision(amp))
        finite = True
        for r in range(TRAIN.rounds):
            record = sim.round(r)
            finite &= all(math.isfinite(v) for m in record["clients"].values() for v in m.values())
        ev = sim.evaluate({"fg": [1]})
        dsc = [v["metrics"]["dsc"]["fg"] for v in ev.values()]
        ok = finite and all(0.0 <= d <= 1.0 for d in dsc)
        cell: dict[str, object] = {"ok": ok, "finite": finite, "dsc": sum(dsc) / len(dsc)}
    except Exception as exc:  # a failing cell is the finding; the sweep goes on
        last = traceback.format_exc().strip().splitlines()
        cell = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300], "where": last[-3:]}
    cell["seconds"] = round(time.perf_counter() - start, 2)
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precisions", nargs="+", default=["off", "bf16", "fp16"])
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = resolve_device(args.device, "--device")
    cpu = torch.device("cpu")
    names = args.methods or list_methods()
    cells: dict[str, dict[str, object]] = {}
    print(f"# {machine(device)}")
    print(
        "| method | CPU fp32 DSC | " + " | ".join(f"{device} {p}" for p in args.precisions) + " |"
    )
    print("|---|---|" + "---|" * len(args.precisions))
    for name in names:
        row = {"cpu-off": check(name, cpu, "off")}
        row |= {f"{device.type}-{p}": check(name, device, p) for p in args.precisions}
        cells[name] = row

        def show(c: dict[str, object]) -> str:
            if not c["ok"]:
                return f"FAIL {c.get('error', 'non-finite')} ({c['seconds']} s)"
            return f"{c['dsc']:.3f} ({c['seconds']} s)"

        cols = [show(row[f"{device.type}-{p}"]) for p in args.precisions]
        print(f"| {name} | {show(row['cpu-off'])} | " + " | ".join(cols) + " |", flush=True)
    failed = [f"{n}/{k}" for n, row in cells.items() for k, c in row.items() if not c["ok"]]
    print(f"\n{len(failed)} failing cells: {', '.join(failed) or 'none'}")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(device), "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
