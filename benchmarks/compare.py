"""Run several methods on one synthetic federation and render one comparison table.

Usage:
    python benchmarks/compare.py benchmarks/configs/faz.yaml \
        --runs fedavg:weak local:weak centralized:full fedlppa:weak --out runs/bench-faz

Each ``method:labels`` pair (``labels`` = weak | full) runs the base config with that method
(method settings come from the base config's ``method_settings.<name>`` block, if any). Run
directories go to ``OUT/<method>-<labels>``; the table (DSC and HD95 per site and average,
like FedLPPA's Tables II-V) and the wall time of every run go to ``OUT/report.md``. The
harness is :func:`fedseg.reproduce.compare_methods`; paper tables: ``fedseg reproduce``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from fedseg.reproduce import compare_methods


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
    report = compare_methods(args.config, args.runs, args.out, args.overrides)
    print(f"wrote {report}")


if __name__ == "__main__":
    main()
