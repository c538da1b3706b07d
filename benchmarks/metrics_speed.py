"""Per-case metrics: fedseg against medpy on the same label maps, with identical values.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/metrics_speed.py [--repeats 7]``.

Each case is a smooth two-class label map (a "disc" with a "cup" inside, as fundus) and a
prediction that is the target shifted by a few elements with some stray blobs. fedseg
scores it with one ``case_metrics`` call (all seven metrics, both classes); medpy with
``dc, jc, precision, recall, hd95, assd, hd`` per class, as evaluation code calls it. The
best of ``--repeats`` runs is reported, as wall and as process CPU time (the machine may
be shared, and CPU time is less sensitive to that).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from medpy.metric import binary as mb
from scipy import ndimage

from fedseg.metrics import METRICS, case_metrics

SIZES: dict[str, tuple[int, ...]] = {"64 px": (64, 64), "384 px": (384, 384), "96^3": (96,) * 3}


def make_case(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A smooth target with labels 0/1/2 (2 inside 1) and a shifted, noisy prediction."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.random(shape), sigma=max(shape) / 16)
    field = (field - field.min()) / (np.ptp(field) or 1.0)
    target = (field > 0.5).astype(np.int64) + (field > 0.7)
    pred = np.roll(target, shift=max(1, shape[0] // 40), axis=0)
    stray = ndimage.gaussian_filter(rng.random(shape), sigma=2) > 0.56
    pred[stray & (pred == 0)] = 1
    return pred, target


def medpy_scores(pred: np.ndarray, target: np.ndarray) -> dict[str, dict[int, float]]:
    """medpy's value of every metric per foreground class."""
    fns = {
        "dsc": mb.dc,
        "jaccard": mb.jc,
        "precision": mb.precision,
        "recall": mb.recall,
        "hd95": mb.hd95,
        "assd": mb.assd,
        "hd": mb.hd,
    }
    out: dict[str, dict[int, float]] = {m: {} for m in METRICS}
    for c in (1, 2):
        p, t = pred == c, target == c
        for m in METRICS:
            out[m][c] = float(fns[m](p, t))
    return out


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Minimum wall and minimum process CPU seconds of ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(
        f"{'case':>8} {'fedseg ms (wall/cpu)':>22} {'medpy ms (wall/cpu)':>22} "
        f"{'ratio wall':>10} {'ratio cpu':>10} {'max |diff|':>10}"
    )
    for name, shape in SIZES.items():
        pred, target = make_case(shape)
        ours = case_metrics(pred, target, 3)
        theirs = medpy_scores(pred, target)
        diff = max(abs(ours[m][c] - theirs[m][c]) for m in METRICS for c in (1, 2))
        fw, fc = best_time(lambda p=pred, t=target: case_metrics(p, t, 3), args.repeats)
        mw, mc = best_time(lambda p=pred, t=target: medpy_scores(p, t), args.repeats)
        print(
            f"{name:>8} {1e3 * fw:>10.2f} /{1e3 * fc:>9.2f} {1e3 * mw:>10.2f} /{1e3 * mc:>9.2f} "
            f"{mw / fw:>9.1f}x {mc / fc:>9.1f}x {diff:>10.1e}"
        )


if __name__ == "__main__":
    main()
