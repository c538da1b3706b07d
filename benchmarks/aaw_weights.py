"""Where adaptive aggregation weights put the weight: a summary of kept AAW runs (FedAvg+AAW,
FedProx+AAW).

Usage:
    python benchmarks/aaw_weights.py RUN_DIR [RUN_DIR ...] [--block 14] [--zero 0.001]

Reads each run's ``rounds.jsonl`` (the server's ``aaw_weights`` and ``aaw_gaps`` per round,
Eqs. 5-7 of the AAW paper) and prints Markdown: per run and site, the mean weight over
the second half of the rounds, the rounds of that half with weight below ``--zero``, the gap
at the last round, and per block of ``--block`` rounds the mean gap and weight per site and
the mean effective number of sites (1 / sum of squared weights, per round). The evidence notes
of the pancreas tables quote it, e.g.::

    python benchmarks/aaw_weights.py docs/evidence/pancreas3d-table2-t1/runs/fedavg-aaw/seed*
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from fedseg.reporting.runs import read_rounds


def server_rounds(run_dir: Path) -> list[dict]:
    """The server's AAW record (round, weights, gaps) of each round with gaps, in round order;
    round 0 has none (no aggregate yet: its weights are FedAvg's)."""
    path = run_dir / "rounds.jsonl"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no rounds.jsonl (expected a finished fedseg run)")
    out = []
    for record in read_rounds(run_dir):
        server = record.get("server") or {}
        if server.get("aaw_gaps"):
            out.append({"r": record["round"], "w": server["aaw_weights"], "g": server["aaw_gaps"]})
    if not out:
        raise SystemExit(f"{path}: no round records aaw_gaps (not an AAW run)")
    return out


def effective_sites(weights: dict[str, float]) -> float:
    """1 / sum of squared weights: the number of equally weighted sites with the same spread."""
    return 1.0 / sum(w * w for w in weights.values())


def summary(run_dir: Path, block: int, zero: float) -> str:
    """Markdown summary of one run."""
    rounds = server_rounds(run_dir)
    sites = sorted(rounds[0]["w"])
    half = rounds[len(rounds) // 2 :]
    lines = [
        f"### {run_dir} (rounds {rounds[0]['r']}-{rounds[-1]['r']} with gaps)",
        "",
        "| site | 2nd-half weight | 2nd-half rounds < " + f"{zero:g} | last gap |",
        "|---|---|---|---|",
    ]
    for s in sites:
        mean = statistics.fmean(r["w"][s] for r in half)
        low = sum(r["w"][s] < zero for r in half)
        lines.append(f"| {s} | {mean:.3f} | {low} / {len(half)} | {rounds[-1]['g'][s]:+.3f} |")
    lines += [
        "",
        "| rounds | "
        + " | ".join(f"gap {s}" for s in sites)
        + " | "
        + " | ".join(f"w {s}" for s in sites)
        + " | effective sites |",
        "|---|" + "---|" * (2 * len(sites) + 1),
    ]
    for start in range(0, len(rounds), block):
        part = rounds[start : start + block]
        gaps = " | ".join(f"{statistics.fmean(r['g'][s] for r in part):+.3f}" for s in sites)
        ws = " | ".join(f"{statistics.fmean(r['w'][s] for r in part):.2f}" for s in sites)
        eff = statistics.fmean(effective_sites(r["w"]) for r in part)
        lines.append(f"| {part[0]['r']}-{part[-1]['r']} | {gaps} | {ws} | {eff:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="FedAvg+AAW run directories")
    parser.add_argument("--block", type=int, default=14, help="rounds per block (default 14)")
    parser.add_argument("--zero", type=float, default=0.001, help="a weight counted as none")
    args = parser.parse_args(argv)
    if args.block < 1:
        raise SystemExit(f"--block {args.block}: expected at least 1")
    sys.stdout.write("\n".join(summary(r, args.block, args.zero) for r in args.runs))


if __name__ == "__main__":
    main()
