"""Training and evaluation throughput (images/s) of the UNet at 64 and 128 px.

Usage: python benchmarks/throughput.py [--sizes 64 128] [--iters 20] [--out docs/benchmarks.md]
Training: forward + backward + AdamW step on batches of 8 single-channel images (2 classes,
partial CE). Evaluation: forward in eval mode + argmax + all six metrics per image.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from fedseg.evaluation import evaluate
from fedseg.losses import PartialCrossEntropy
from fedseg.models import UNet
from fedseg.testing import toy_federation


def bench(size: int, iters: int, batch: int = 8) -> tuple[float, float]:
    torch.manual_seed(0)
    _, sites = toy_federation(1, n_train=batch, n_test=64, size=size, labels="weak")
    site = sites["site0"]
    net = UNet(1, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    loss_fn = PartialCrossEntropy(255)
    x, y = site.train_images, site.train_labels
    net.train()
    for i in range(iters + 2):
        if i == 2:
            t0 = time.perf_counter()
        loss = loss_fn(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    train_ips = iters * batch / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    evaluate(
        net,
        site.test_images,
        site.test_masks,
        {"fg": [1]},
        batch_size=16,
        device=torch.device("cpu"),
    )
    eval_ips = len(site.test_images) / (time.perf_counter() - t0)
    return train_ips, eval_ips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}")
    print("| size | train img/s | eval img/s (incl. metrics) |\n|---|---|---|")
    for s in args.sizes:
        tr, ev = bench(s, args.iters)
        print(f"| {s} | {tr:.1f} | {ev:.1f} |")


if __name__ == "__main__":
    main()
