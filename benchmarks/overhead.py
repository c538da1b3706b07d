"""Framework overhead of a fedseg round against a bare PyTorch loop of the same steps.

Usage: python benchmarks/overhead.py [--sizes 64 128] [--rounds 6] [--sites 3] [--iters 5]
       [--batch 4] [--profile] [--workers 2]

Both sides run FedAvg (default UNet, AdamW, partial CE on weak labels, no augmentation, one
torch thread) on the same in-memory sites: per site, load the global weights, build the
optimiser, ``iters`` steps on random batches, copy the weights; then the sample-weighted
average. The fedseg side is a :class:`~fedseg.engine.simulation.Simulation` round (payload
checks, seeding, contexts, upload validation, communication counting, the server step).
Rounds of the two alternate so that load from other processes hits both alike; printed per
size are the median CPU seconds (``time.process_time``) and wall seconds per round, and the
ratios fedseg / bare. ``--profile`` prints fedseg's top functions by own time (cProfile).
``--workers N`` also times fedseg rounds with ``engine.workers`` N against 1 (one torch thread
per process; CPU seconds include the worker processes; their start-up is excluded).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedseg.engine.simulation import Simulation
from fedseg.losses import PartialCrossEntropy
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet
from fedseg.testing import toy_federation


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def bench(size: int, rounds: int, sites: int, iters: int, batch: int, profile: bool) -> None:
    spec, data = toy_federation(sites, n_train=3 * batch, size=size)
    train = TrainSettings(
        rounds=rounds,
        local_iters=iters,
        batch_size=batch,
        augment=False,
        lr_schedule="constant",
    )
    cls = get_method("fedavg")
    sim = Simulation(cls(cls.Config(), spec), data, train, seed=0)

    torch.manual_seed(0)
    net = UNet(1, 2)
    loss_fn = PartialCrossEntropy(spec.ignore_index)
    glob = {k: v.clone() for k, v in net.state_dict().items()}
    counts = [d.spec.num_train for d in data.values()]
    weights = [c / sum(counts) for c in counts]

    def bare_round(r: int) -> None:
        uploads = []
        for i, site in enumerate(data.values()):
            net.load_state_dict(glob)
            opt = torch.optim.AdamW(net.parameters(), lr=train.lr, weight_decay=train.weight_decay)
            gen = torch.Generator().manual_seed(1000 * r + i)
            net.train()
            x, y = site.train_images, site.train_labels
            for _ in range(iters):
                idx = torch.randperm(len(x), generator=gen)[:batch]
                loss = loss_fn(net(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            uploads.append({k: v.detach().clone() for k, v in net.state_dict().items()})
        for k, ref in glob.items():
            acc = sum(w * u[k].double() for u, w in zip(uploads, weights, strict=True))
            glob[k] = (acc if ref.is_floating_point() else acc.round()).to(ref.dtype)

    ours, bare = [], []
    prof = cProfile.Profile() if profile else None
    for r in range(rounds):
        if prof is not None and r > 0:
            prof.enable()
        ours.append(_timed(lambda r=r: sim.round(r)))
        if prof is not None:
            prof.disable()
        bare.append(_timed(lambda r=r: bare_round(r)))
    # the first round of each side warms up allocators and kernels
    cpu_o, wall_o = (statistics.median(v[j] for v in ours[1:]) for j in (0, 1))
    cpu_b, wall_b = (statistics.median(v[j] for v in bare[1:]) for j in (0, 1))
    print(
        f"| {size} | {sites}x{iters} steps of {batch} | {cpu_o:.3f} | {cpu_b:.3f} "
        f"| {cpu_o / cpu_b:.3f} | {wall_o:.3f} | {wall_b:.3f} | {wall_o / wall_b:.3f} |",
        flush=True,
    )
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def _cpu_with_workers(sim: Simulation) -> float:
    """CPU seconds of this process and of the simulation's worker processes (Linux)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for slot in getattr(sim.link, "_slots", []):
        for pid in slot.pool._processes:  # the executor keeps its processes by pid
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bench_workers(size: int, rounds: int, sites: int, iters: int, batch: int, n: int) -> None:
    """Median wall seconds per fedseg round with ``n`` worker processes against one."""
    spec, data = toy_federation(sites, n_train=3 * batch, size=size)
    train = TrainSettings(rounds=rounds, local_iters=iters, batch_size=batch, augment=False)
    cls = get_method("fedavg")
    walls, cpus = {}, {}
    for workers in (1, n):
        sim = Simulation(cls(cls.Config(), spec), data, train, seed=0, workers=workers, threads=1)
        sim.round(0)  # starts the worker processes
        c0, per_round = _cpu_with_workers(sim), []
        for r in range(1, rounds):
            per_round.append(_timed(lambda r=r, sim=sim: sim.round(r))[1])
        cpus[workers] = (_cpu_with_workers(sim) - c0) / (rounds - 1)
        sim.close()
        walls[workers] = statistics.median(per_round)
    print(
        f"| {size} | {sites} | {walls[1]:.3f} | {walls[n]:.3f} | {walls[1] / walls[n]:.2f} "
        f"| {cpus[1]:.3f} | {cpus[n]:.3f} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        "| px | work per round | fedseg CPU s | bare CPU s | CPU ratio | fedseg wall s "
        "| bare wall s | wall ratio |\n|---|---|---|---|---|---|---|---|"
    )
    for size in args.sizes:
        bench(size, args.rounds, args.sites, args.iters, args.batch, args.profile)
    if args.workers > 1:
        print(
            f"\n| px | sites | wall s, 1 worker | wall s, {args.workers} workers | speed-up "
            "| CPU s, 1 | CPU s, N |\n|---|---|---|---|---|---|---|"
        )
        for size in args.sizes:
            bench_workers(size, args.rounds, args.sites, args.iters, args.batch, args.workers)


if __name__ == "__main__":
    main()
