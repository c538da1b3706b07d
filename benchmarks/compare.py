"""Run several methods on one synthetic federation and render one comparison table.

Usage:
    python benchmarks/compare.py benchmarks/configs/faz.yaml \
        --runs fedavg:weak local:weak centralized:full fedlppa:weak --out runs/bench-faz

Each ``method:labels`` pair (``labels`` = weak | full) runs the base config with that method
(method settings come from the base config's ``method_settings.<name>`` block, if any). Run
directories go to ``OUT/<method>-<labels>``; the table (DSC and HD95 per site and average,
like FedLPPA's Tables II-V) and the wall time of every run go to ``OUT/report.md``.
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from pathlib import Path

import yaml

from fedseg.config import apply_overrides, parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.outputs import write_run_outputs
from fedseg.reporting.compare import comparison_table


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("config", type=Path)
    ap.add_argument("--runs", nargs="+", required=True, help="method:labels pairs")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="overrides", nargs="*", default=[], help="key.sub=value")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base = yaml.safe_load(args.config.read_text())
    settings = base.pop("method_settings", {}) or {}

    base = apply_overrides(base, args.overrides)
    results, times = [], []
    for item in args.runs:
        method, _, labels = item.partition(":")
        raw = copy.deepcopy(base)
        raw["method"] = {"name": method, **settings.get(method, {})}
        raw["data"]["labels"] = labels or "weak"
        raw["name"] = f"{method}-{raw['data']['labels']}"
        t0 = time.perf_counter()
        run_dir = args.out / raw["name"]
        res = InProcessRunner(parse_config(raw, str(args.config)), run_dir).run()
        write_run_outputs(run_dir, res)
        times.append((raw["name"], time.perf_counter() - t0))
        results.append(res)
        avg = res["average"]["dsc"]
        mean = 100 * sum(avg.values()) / len(avg)
        print(f"{raw['name']:>24}: mean DSC {mean:.2f}  ({times[-1][1]:.0f}s)")
    lines = [comparison_table(results), "## Wall time", "", "| run | seconds |", "|---|---|"]
    lines += [f"| {n} | {t:.0f} |" for n, t in times]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
