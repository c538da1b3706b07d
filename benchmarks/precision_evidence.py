"""Evidence for ``engine.amp: bf16`` against float32: paired per-case differences next to the
float32 seed-to-seed spread, per shipped config (issue 26).

Usage: OMP_NUM_THREADS=1 python benchmarks/precision_evidence.py [CONFIG ...] [--seeds 0 1 2]
    [--metric dsc] [--out runs/precision_evidence] [--set key=value ...]

Every config runs once per seed with ``engine.amp=off`` and once with ``engine.amp=bf16``
(everything else as shipped, plus ``--set``) through :func:`fedseg.reproduce.run_config`,
which reuses a finished run. From each run's ``cases.csv`` (site, case, id, region, metric,
value) it reports, for ``--metric``:

- ``bf16 - fp32``: the mean over seeds of the paired difference of the run means (the same
  seed and cases in both precisions), with its sample SD over seeds;
- ``mean |case diff|``: the mean absolute per-case difference over cases and seeds;
- ``fp32 seed SD``: the sample SD over seeds of the float32 run means, and the mean per-case
  SD over seeds: the noise a precision change has to stay inside;
- the paired test of :mod:`fedseg.reporting.stats` over test cases (each case averaged over
  regions and seeds, as ``fedseg reproduce`` compares rows): median bf16 - fp32 difference
  with its bootstrap 95 % interval, Wilcoxon p and the number of pairs.

DSC values are in points (0-100), as the papers give them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import yaml

from fedseg.config import apply_overrides
from fedseg.configs import resolve_config
from fedseg.reporting.stats import Paired, case_values, format_p, paired, seed_mean
from fedseg.reproduce import run_config

CONFIGS = [
    "quickstart",
    "fedlppa/table7_full",
    "fedbcs/fedbcs_nuclei",
    "vc/table1_ours",
    "pancreas3d/fedavg",
]
PRECISIONS = ("off", "bf16")

Case = tuple[str, str, str, str]
"""(site, case, id, region) of a ``cases.csv`` row."""


def read_cases(run_dir: Path, metric: str) -> dict[Case, float]:
    """``metric`` per case and region from ``run_dir/cases.csv``."""
    with (run_dir / "cases.csv").open(newline="") as fh:
        return {
            (r["site"], r["case"], r["id"], r["region"]): float(r["value"])
            for r in csv.DictReader(fh)
            if r["metric"] == metric
        }


def run_all(
    name: str, seeds: list[int], out: Path, overrides: list[str], metric: str
) -> tuple[dict[tuple[str, int], dict[Case, float]], Paired]:
    """Cases of every (precision, seed) run of config ``name``, and bf16 against fp32 on
    the seed means of each test case."""
    path = resolve_config(name)
    runs, per_case = {}, {}
    for seed in seeds:
        for amp in PRECISIONS:
            raw = yaml.safe_load(path.read_text()) or {}
            raw = apply_overrides(raw, [*overrides, f"seed={seed}", f"engine.amp={amp}"])
            run_dir = out / name.replace("/", "-") / f"{amp}-seed{seed}"
            run_config(raw, run_dir, str(path))
            runs[amp, seed] = read_cases(run_dir, metric)
            per_case.setdefault(amp, []).append(case_values(run_dir / "cases.csv", metric))
    means = {amp: seed_mean(v, f"{name} {amp}") for amp, v in per_case.items()}
    return runs, paired(means["bf16"], means["off"], f"{name}: bf16 vs fp32")


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def summarize(runs: dict[tuple[str, int], dict[Case, float]], seeds: list[int]) -> list[float]:
    """[bf16 - fp32 mean, its SD over seeds, mean |case diff|, fp32 seed SD of run means,
    mean per-case fp32 SD over seeds]."""
    diffs, abs_case = [], []
    for seed in seeds:
        fp32, bf16 = runs["off", seed], runs["bf16", seed]
        common = sorted(fp32.keys() & bf16.keys())
        if len(common) != len(fp32):
            raise SystemExit(f"seed {seed}: fp32 and bf16 runs scored different cases")
        diffs.append(statistics.fmean(bf16[c] - fp32[c] for c in common))
        abs_case += [abs(bf16[c] - fp32[c]) for c in common]
    means = [statistics.fmean(runs["off", s].values()) for s in seeds]
    cases = runs["off", seeds[0]].keys()
    per_case = [_sd([runs["off", s][c] for s in seeds]) for c in cases]
    return [
        100 * x
        for x in (
            statistics.fmean(diffs),
            _sd(diffs),
            statistics.fmean(abs_case),
            _sd(means),
            statistics.fmean(per_case),
        )
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("configs", nargs="*", default=CONFIGS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--metric", default="dsc")
    ap.add_argument("--out", type=Path, default=Path("runs/precision_evidence"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    print(
        f"| config | bf16 - fp32 ({args.metric}, mean over {len(args.seeds)} seeds ± SD) "
        "| mean abs case diff | fp32 seed SD (run means) | fp32 seed SD (per case) "
        "| paired over cases: median [95 % CI], p, pairs | within the seed SD |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name in args.configs:
        runs, test = run_all(name, args.seeds, args.out, args.overrides, args.metric)
        d, d_sd, abs_case, sd_runs, sd_case = summarize(runs, args.seeds)
        print(
            f"| {name} | {d:+.2f} ± {d_sd:.2f} | {abs_case:.2f} | {sd_runs:.2f} | {sd_case:.2f} "
            f"| {test.median:+.2f} [{test.low:+.2f}, {test.high:+.2f}], p {format_p(test.p)}, "
            f"{test.pairs} | {'yes' if abs(d) <= sd_runs else 'no'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
