"""Training and evaluation throughput (images/s) per network and precision setting.

Usage: OMP_NUM_THREADS=1 python benchmarks/throughput.py [--nets unet3d ...] [--settings ...]
    [--iters 6] [--repeats 3] [--threads 1]

Every setting runs through fedseg's own precision code (``fedseg.methods.training.precision``,
``channels_last_model``, ``autocast``, ``memory_format``), so it measures what
``engine.amp``/``engine.channels_last`` do in a run. Training step = forward + loss +
backward + AdamW step; evaluation = :func:`fedseg.evaluation.predict` (eval-mode forward and
argmax in ``torch.inference_mode``, no metrics). 2D networks: batch 8 at 64 px; 3D networks:
batch 2 at 32^3. Each cell is the median over ``--repeats`` timings of ``--iters`` steps,
wall time and CPU time; images/s are per CPU second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fedseg.evaluation import predict
from fedseg.losses import DiceBCELoss
from fedseg.methods.training import autocast, channels_last_model, memory_format, precision
from fedseg.models import parse_model

NETS: dict[str, tuple[dict[str, object], int]] = {
    "unet": ({"name": "unet"}, 2),
    "harmofl_unet": ({"name": "harmofl_unet"}, 2),
    "pvtv2_fpn": ({"name": "pvtv2_fpn"}, 2),
    "synergynet3d": ({"name": "synergynet"}, 3),
    "unet3d": ({"name": "unet"}, 3),
}
SETTINGS: dict[str, tuple[str, bool]] = {
    "fp32": ("off", False),
    "fp32+CL": ("off", True),
    "bf16": ("bf16", False),
    "bf16+CL": ("bf16", True),
}
CPU = torch.device("cpu")


def cpu_model() -> str:
    """The CPU model name as the kernel reports it (``/proc/cpuinfo``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _timed(fn: Callable[[], None], iters: int, repeats: int) -> tuple[float, float]:
    """Median seconds (wall, CPU) of ``iters`` calls of ``fn``, after one warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(iters):
            fn()
        walls.append((time.perf_counter() - t0) / iters)
        cpus.append((time.process_time() - c0) / iters)
    return statistics.median(walls), statistics.median(cpus)


def bench(net_name: str, setting: str, iters: int, repeats: int) -> dict[str, float]:
    """Seconds per training step and per evaluated batch (wall and CPU) and images per CPU
    second (on a shared machine CPU time is the stable measure)."""
    block, ndim = NETS[net_name]
    amp, cl = SETTINGS[setting]
    batch, size = (8, 64) if ndim == 2 else (2, 32)
    torch.manual_seed(0)
    net: nn.Module = parse_model(block).build(1, 2, ndim)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    loss_fn = DiceBCELoss()
    x = torch.randn(batch, 1, *(size,) * ndim)
    y = (torch.rand(batch, *(size,) * ndim) > 0.8).long()

    def step() -> None:
        with autocast(CPU):
            loss = loss_fn(net(memory_format(x)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with precision(amp, cl):  # type: ignore[arg-type]
        with channels_last_model(net):
            net.train()
            train = _timed(step, iters, repeats)
        evaluate = _timed(lambda: predict(net, x, batch, CPU), iters, repeats)
    return {
        "train_s": train[0],
        "train_cpu_s": train[1],
        "eval_s": evaluate[0],
        "eval_cpu_s": evaluate[1],
        "train_ips": batch / train[1],
        "eval_ips": batch / evaluate[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {cpu_model()}, "
        f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        "| network | setting | train ms/step wall | CPU | train img/s (CPU) "
        "| eval ms/batch wall | CPU | eval img/s (CPU) |\n|---|---|---|---|---|---|---|---|"
    )
    for name in args.nets:
        for setting in args.settings:
            r = bench(name, setting, args.iters, args.repeats)
            print(
                f"| {name} | {setting} | {1e3 * r['train_s']:.0f} | {1e3 * r['train_cpu_s']:.0f} "
                f"| {r['train_ips']:.1f} | {1e3 * r['eval_s']:.0f} | {1e3 * r['eval_cpu_s']:.0f} "
                f"| {r['eval_ips']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
