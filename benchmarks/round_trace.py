"""Training metrics of an evidence table's kept runs at chosen rounds, by row.

    python benchmarks/round_trace.py docs/evidence/fedbcs-tau-prostate \
        --metric l_contra --metric l_consis --rounds 10,30,60 --clusters

Reads every ``runs/<row>/seed<k>/rounds.jsonl`` under the table folder. For each row and
``--metric`` (a client metric of ``rounds.jsonl``: ``loss``, ``l_contra``, ...) it prints
the mean over sites and then over seeds at each of ``--rounds`` (the last recorded round
when a run is shorter). ``seg`` is ``loss`` minus every other loss-part metric the
clients record (``l_*``), i.e. the segmentation part when each part has weight 1.
``--clusters`` counts, per row, the rounds (summed over seeds) in which the server's
clustering (``server.clusters``, FedBCS) kept one cluster per class at every level, and the
mean number of clusters per class and level over all of them.
Nothing is trained.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load_rounds(run: Path) -> list[dict]:
    """A run's ``rounds.jsonl`` records, in order."""
    with (run / "rounds.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def site_mean(record: dict, metric: str) -> float:
    """``metric`` averaged over the record's clients (``seg``: loss minus its ``l_*`` parts)."""
    values = []
    for client in record["clients"].values():
        if metric == "seg":
            parts = sum(v for k, v in client.items() if k.startswith("l_"))
            values.append(client["loss"] - parts)
        else:
            values.append(client[metric])
    return statistics.fmean(values)


def at_round(records: list[dict], wanted: int) -> dict:
    """The record of round ``wanted``, or the last one when the run stopped earlier."""
    by_round = {r["round"]: r for r in records}
    return by_round.get(wanted, records[-1])


def cluster_counts(records: list[dict]) -> tuple[int, list[int]]:
    """(rounds whose every level has one cluster per class, every per-class cluster count)."""
    clustered = [r["server"]["clusters"] for r in records if r.get("server", {}).get("clusters")]
    single = sum(all(n == 1 for sizes in c.values() for n in sizes) for c in clustered)
    return single, [n for c in clustered for sizes in c.values() for n in sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="an evidence table folder (with runs/)")
    parser.add_argument("--metric", action="append", default=[], help="client metric, or seg")
    parser.add_argument("--rounds", default="10,30,60", help="comma-separated round indices")
    parser.add_argument("--clusters", action="store_true", help="count single-cluster rounds")
    args = parser.parse_args()
    rounds = [int(r) for r in args.rounds.split(",")]
    metrics = args.metric or ["loss"]
    head = ["row", "seeds"] + [f"{m} @{r}" for m in metrics for r in rounds]
    if args.clusters:
        head += ["one cluster per class (rounds)", "clusters per class"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in sorted(p for p in (args.table / "runs").iterdir() if p.is_dir()):
        runs = sorted(p for p in row.iterdir() if (p / "rounds.jsonl").exists())
        if not runs:
            continue
        traces = [load_rounds(run) for run in runs]
        cells = [row.name, str(len(runs))]
        for metric in metrics:
            for r in rounds:
                try:
                    per_seed = [site_mean(at_round(t, r), metric) for t in traces]
                except KeyError:
                    cells.append("—")
                    continue
                cells.append(f"{statistics.fmean(per_seed):.3f}")
        if args.clusters:
            counts = [cluster_counts(t) for t in traces]
            single = sum(c[0] for c in counts)
            sizes = [n for c in counts for n in c[1]]
            total = sum(len(t) for t in traces) if sizes else 0
            cells.append(f"{single} / {total}" if sizes else "—")
            cells.append(f"{statistics.fmean(sizes):.2f}" if sizes else "—")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
