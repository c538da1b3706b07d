"""Weak-label statistics per annotation type and synthetic 2D task (docs/weak_labels.md).

    OMP_NUM_THREADS=1 python benchmarks/weak_label_stats.py [--size 64] [--per-site 8] [--seed 0]

Prints the markdown table: for every class the share of its pixels labelled with it, the
label error rate (overall and per label class) and the share of meaningful regions labelled.
"""

from __future__ import annotations

import argparse
import platform
import time

from fedseg.data.synth import SYNTH_TASKS
from fedseg.data.weak.stats import stats_table, synthetic_stats

TYPES = ("point", "scribble", "scribble2", "block", "box", "rotated_box")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--per-site", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    rows, names = {}, {}
    for task in SYNTH_TASKS.names():
        t = SYNTH_TASKS.get(task)
        if len(t.spatial_shape(args.size)) != 2:
            continue
        rows[task] = synthetic_stats(
            task, TYPES, size=args.size, per_site=args.per_site, seed=args.seed
        )
        names[task] = t.class_names
        if task == "brain":  # the binary white-matter federation of issue 12
            rows["brain_wm"] = synthetic_stats(
                task, TYPES, size=args.size, per_site=args.per_site, seed=args.seed, foreground=(2,)
            )
            names["brain_wm"] = ("background", "white_matter")
    print(stats_table(rows, names))
    print(
        f"\n{args.size} px, {args.per_site} masks per default site, seed {args.seed}; "
        f"{time.perf_counter() - start:.0f} s on {platform.processor() or platform.machine()}"
    )


if __name__ == "__main__":
    main()
