"""Seconds per local DP-SGD step (Opacus per-example gradients) beside a plain step.

Usage: python benchmarks/privacy_speed.py [--size 48] [--batch 8] [--steps 10]
       [--widths 16 32 64 128 256] [--out FILE.json]

One site of a toy federation (full labels, ``--size`` px, 4 x ``--batch`` training
examples), the UNet with group norm at ``--widths``, SGD. Timed, each as the median over
``--steps`` steps after one warm-up step, on the current torch threads (run with
``OMP_NUM_THREADS=1`` to compare with docs/privacy.md):

- ``plain``: one ordinary step of ``train_steps`` on a batch of ``--batch``;
- ``dp_opacus``: one DP-SGD step of ``privacy.mode: local`` (Poisson sample of expected size
  ``--batch``, per-example gradients from one batched pass through Opacus's GradSampleModule,
  clipping, noise);
- ``batch_of_one``: the same step with each example's gradient from its own forward and
  backward pass (fedseg's implementation before Opacus), on the same number of examples.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedseg.engine.sites import client_context
from fedseg.methods.base import TrainSettings
from fedseg.methods.training import segmentation_loss, step_loop, train_steps
from fedseg.models.unet import UNetConfig
from fedseg.privacy import PrivacySettings
from fedseg.privacy.local import DPSGD
from fedseg.testing import toy_federation


def median_seconds(step: Callable[[], None], steps: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    spec, data = toy_federation(1, n_train=4 * args.batch, size=args.size, labels="full")
    train = TrainSettings(optimizer="sgd", lr=0.01, batch_size=args.batch, augment=False)
    torch.manual_seed(0)
    dropout = (0.0,) * len(args.widths)
    model = UNetConfig(widths=tuple(args.widths), dropout=dropout, norm="group").build(1, 2, 2)
    ctx = client_context(
        data["site0"], spec, train, round_index=0, seed=0, model=model, device=torch.device("cpu")
    )
    settings = PrivacySettings(mode="local", clip=1.0, noise_multiplier=1.0)
    dp = DPSGD(settings, ctx, 0)
    loss_fn = segmentation_loss(ctx)
    images, labels = next(ctx.ordered_batches(args.batch))
    params = list(model.parameters())

    def dp_step() -> None:
        with step_loop(dp):
            train_steps(model, ctx, iters=1)

    def batch_of_one() -> None:
        grads = [torch.zeros_like(p) for p in params]
        for i in range(len(images)):
            g = torch.autograd.grad(loss_fn(model(images[i : i + 1]), labels[i : i + 1]), params)
            norm = float(torch.cat([x.flatten() for x in g]).norm())
            for s, x in zip(grads, g, strict=True):
                s.add_(x, alpha=min(1.0, 1.0 / norm))
        for p, s in zip(params, grads, strict=True):
            p.grad = (s + torch.randn_like(s)) / args.batch
        torch.optim.SGD(params, lr=0.01).step()

    result = {
        "size": args.size,
        "batch": args.batch,
        "widths": args.widths,
        "parameters": sum(p.numel() for p in params),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "seconds_per_step": {
            "plain": median_seconds(lambda: train_steps(model, ctx, iters=1), args.steps),
            "dp_opacus": median_seconds(dp_step, args.steps),
            "batch_of_one": median_seconds(batch_of_one, args.steps),
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
