"""Which synthetic federation each kept evidence run trained and tested on.

    OMP_NUM_THREADS=1 python benchmarks/data_seed_audit.py docs/evidence/fedbcs-table1-prostate \
        --csv docs/evidence/checks/data-seed-audit/audit.csv

Until 2026-11-29 a run that found its ``data.root`` missing synthesized it with the *run's*
seed, so a table whose runs were spread over machines could mix federations drawn with
different seeds (docs/data.md, "In a run config"). A kept run records its first round's
training loss per site (``rounds.jsonl``), which depends on the images, the weak labels and the
model's start; this script replays that round (the run's own config, stopped after its first
round, nothing evaluated) on the federation drawn with each candidate synthesis seed, starting
with 0, and reports the seed whose replay gives the recorded losses. The same data and run seed
give the same losses to about 1e-5 on another CPU (kernel rounding), another federation differs
by 1e-3 or more; ``--tolerance`` is the boundary. Runs copied from another table
(``origin.txt``) are reported once, under their source.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from fedseg.config import from_run_dump, parse_config
from fedseg.engine.runner import InProcessRunner


def round_losses(record: dict) -> dict[str, float]:
    """A ``rounds.jsonl`` record's training loss per site."""
    return {site: float(v["loss"]) for site, v in record["clients"].items()}


def first_losses(rounds: Path) -> dict[str, float]:
    """The first recorded round's training loss per site."""
    with rounds.open() as f:
        return round_losses(json.loads(f.readline()))


class _FirstRound(Exception):
    """Stops a replay once its first round is recorded."""

    def __init__(self, record: dict) -> None:
        self.losses = round_losses(record)


def _stop(record: dict) -> None:
    raise _FirstRound(record)


def replay(run: Path, synth_seed: int, scratch: Path) -> dict[str, float]:
    """Round 0 of ``run``'s config (all its settings, the rounds included: a schedule over
    the run's length sets round 0's learning rates) on the federation drawn with
    ``synth_seed``."""
    raw = from_run_dump(yaml.safe_load((run / "config.yaml").read_text()))
    synth = dict(raw["data"]["synth"], seed=synth_seed)
    key = hashlib.sha256(json.dumps(synth, sort_keys=True).encode()).hexdigest()[:16]
    raw["data"] = {**raw["data"], "root": str(scratch / "data" / key), "synth": synth}
    raw["eval"] = {**raw.get("eval", {}), "every": 0, "save_models": False}
    cfg = parse_config(raw, str(run / "config.yaml"))
    try:
        InProcessRunner(cfg, Path(tempfile.mkdtemp(dir=scratch))).run(on_round=_stop)
    except _FirstRound as first:
        return first.losses
    raise RuntimeError(f"{run}: the replay finished without recording a round")


def audit(run: Path, seeds: list[int], tolerance: float, scratch: Path) -> dict[str, object]:
    """The candidate synthesis seed that reproduces ``run``'s first losses, with the gaps."""
    recorded = first_losses(run / "rounds.jsonl")
    gaps: dict[int, float] = {}
    for seed in seeds:
        got = replay(run, seed, scratch)
        gaps[seed] = max(abs(got[s] - recorded[s]) for s in recorded)
        if gaps[seed] < tolerance:
            break
    best = min(gaps, key=gaps.__getitem__)
    return {
        "run": str(run),
        "synth_seed": best if gaps[best] < tolerance else "none",
        "gaps": " ".join(f"{s}:{g:.1e}" for s, g in gaps.items()),
    }


def classify(gaps: str, tolerance: float, margin: float) -> str:
    """``exact S`` where seed S's replay gave the recorded losses within ``tolerance``;
    ``nearest S`` where no replay did but S's gap is ``margin`` times below every other
    seed's (a bf16 run replayed on another CPU: its kernels round differently at about 1e-3);
    ``undecided`` otherwise."""
    by_seed = {int(s): float(g) for s, g in (item.split(":") for item in gaps.split())}
    best = min(by_seed, key=by_seed.__getitem__)
    if by_seed[best] < tolerance:
        return f"exact {best}"
    others = [g for s, g in by_seed.items() if s != best]
    if others and min(others) > margin * by_seed[best]:
        return f"nearest {best}"
    return "undecided"


def _table_and_run(run: str) -> tuple[str, str]:
    """An evidence table's name and the run's path in it; a check folder's run (no
    ``runs/``) is named by the check folder, the first folder under ``checks/``."""
    if "/runs/" in run:
        table, rest = run.split("/runs/")
        return Path(table).name, rest
    parts = Path(run).parts
    at = parts.index("checks") + 1 if "checks" in parts else len(parts) - 2
    return parts[at], "/".join(parts[at + 1 :]) or parts[at]


def find_runs(folder: Path) -> list[Path]:
    """Every run under ``folder`` (a directory with ``config.yaml`` and ``rounds.jsonl``), or
    ``folder`` itself when it is one: evidence tables keep theirs in ``runs/<row>/seed<k>``,
    check folders in any layout."""
    found = {p.parent for p in folder.rglob("rounds.jsonl") if (p.parent / "config.yaml").is_file()}
    return sorted(found)


def summary(path: Path, tolerance: float, margin: float) -> None:
    """Print, per evidence table, how many audited runs each verdict of :func:`classify` got,
    then every run not ``exact 0``."""
    rows = list(csv.DictReader(path.open()))
    tables: dict[str, Counter[str]] = defaultdict(Counter)
    odd = []
    for row in rows:
        table, run = _table_and_run(row["run"])
        verdict = classify(row["gaps"], tolerance, margin)
        tables[table][verdict] += 1
        if verdict != "exact 0":
            odd.append(f"| {table} | {run} | {verdict} | {row['gaps']} |")
    names = sorted({v for c in tables.values() for v in c})
    print("| table | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for table, counts in tables.items():
        print(f"| {table} | " + " | ".join(str(counts[v]) for v in names) + " |")
    print("\n| table | run | verdict | gap per synthesis seed |\n|---|---|---|---|")
    print("\n".join(odd))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders", nargs="*", type=Path, help="evidence tables, check folders or runs"
    )
    parser.add_argument("--seeds", default="0,1,2", help="candidate synthesis seeds, in order")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--csv", type=Path, help="append one line per run here")
    parser.add_argument("--summary", type=Path, help="summarise this audit CSV and stop")
    parser.add_argument("--margin", type=float, default=5.0, help="see classify()")
    args = parser.parse_args()
    if args.summary:
        summary(args.summary, args.tolerance, args.margin)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    done: set[str] = set()
    if args.csv and args.csv.is_file():
        done = {r["run"] for r in csv.DictReader(args.csv.open())}
    with tempfile.TemporaryDirectory() as tmp:
        for folder in args.folders:
            for run in find_runs(folder):
                if (run / "origin.txt").is_file() or str(run) in done:
                    continue
                row = audit(run, seeds, args.tolerance, Path(tmp))
                print(
                    f"{row['run']}: synthesis seed {row['synth_seed']} ({row['gaps']})", flush=True
                )
                if args.csv:
                    new = not args.csv.is_file()
                    args.csv.parent.mkdir(parents=True, exist_ok=True)
                    with args.csv.open("a", newline="") as f:
                        writer = csv.DictWriter(f, fieldnames=list(row))
                        if new:
                            writer.writeheader()
                        writer.writerow(row)


if __name__ == "__main__":
    main()
