"""FedLPPA's personal parts on CPU: the LA update before/after issue 12, with control rows.

    OMP_NUM_THREADS=1 python benchmarks/fedlppa_personalisation.py [--rounds 10] [--iters 5]

On the template-derived brain federation (4 simulated sites, classes background / grey
matter / white matter; grey matter surrounds white matter) with the weak annotations
scribble, point, block, box (-> block), it trains:

- ``fedlppa_sgd1``: FedLPPA with the plain LA step at eta 1 (FedALA's / the authors' value,
  fedseg's default before issue 12);
- ``fedlppa``: FedLPPA with its current defaults (LA: Adam step at the round's learning rate);
- ``fedavg``: FedAvg on the weak labels;
- ``lt_weak`` / ``lt_full``: local training on weak labels / on the full masks;

and prints, per arm, the mean test DSC over sites per class, precision and recall (mean over
sites and classes), the wall time, and for FedLPPA the
last round's LA statistics (mean weight and local share of the main decoder, mean over sites)
and the affinity drift. ``--arms`` picks arms. Nothing here is tuned: every arm uses the
same ``train`` settings, and FedLPPA its documented defaults.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedseg.data import FederatedDataset
from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels
from fedseg.engine.simulation import Simulation
from fedseg.engine.sites import load_sites
from fedseg.methods import TrainSettings, get_method

ARMS: dict[str, tuple[str, dict[str, Any], str]] = {
    # the paper reading's LA step (Adam) against the plain step (variant: paper in both arms)
    "fedlppa_sgd1": ("fedlppa", {"variant": "paper", "la_update": "sgd", "la_eta": 1.0}, "weak"),
    "fedlppa": ("fedlppa", {"variant": "paper"}, "weak"),
    "fedavg": ("fedavg", {}, "weak"),
    "lt_weak": ("local", {}, "weak"),
    "lt_full": ("local", {}, "full"),
}
ANNOTATIONS = ("scribble", "point", "block", "box")


def run_arm(root: Path, arm: str, train: TrainSettings, seed: int) -> dict[str, Any]:
    name, config, labels = ARMS[arm]
    fed = FederatedDataset.open(root)
    spec, sites = load_sites(fed, labels)
    cls = get_method(name)
    method = cls(cls.Config(**config), Simulation.method_spec(cls, spec, sites))
    sim = Simulation(method, sites, train, seed=seed)
    start = time.perf_counter()
    last: dict[str, Any] = {}
    for r in range(train.rounds):
        last = sim.round(r)
    regions = fed.manifest.regions
    results = sim.evaluate(regions=regions)
    dsc = {
        region: sum(res["metrics"]["dsc"][region] for res in results.values()) / len(results)
        for region in regions
    }
    pr = {
        m: sum(res["metrics"][m][region] for res in results.values() for region in regions)
        / (len(results) * len(regions))
        for m in ("precision", "recall")
    }
    out: dict[str, Any] = {"dsc": dsc, **pr, "seconds": time.perf_counter() - start}
    clients = list(last.get("clients", {}).values())
    if clients and "la_main_mean" in clients[0]:
        out["la_main_mean"] = sum(c["la_main_mean"] for c in clients) / len(clients)
        out["la_main_local_share"] = sum(c["la_main_local_share"] for c in clients) / len(clients)
    elif clients and "la_weight_mean" in clients[0]:  # fedseg before issue 12
        out["la_main_mean"] = sum(c["la_weight_mean"] for c in clients) / len(clients)
    if "affinity_drift" in last.get("server", {}):
        out["affinity_drift"] = last["server"]["affinity_drift"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--per-site", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train = TrainSettings(
        rounds=args.rounds,
        local_iters=args.iters,
        batch_size=args.batch_size,
        lr=args.lr,
        optimizer="adamw",
        lr_schedule="poly",
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "brain"
        synthesize("brain", root, size=args.size, per_site=args.per_site, seed=args.seed)
        names = FederatedDataset.open(root).manifest.site_names
        generate_weak_labels(
            root, seed=args.seed, annotations=dict(zip(names, ANNOTATIONS, strict=True))
        )
        rows = {arm: run_arm(root, arm, train, args.seed) for arm in args.arms.split(",")}
    regions = list(next(iter(rows.values()))["dsc"])
    print(
        "| arm | "
        + " | ".join(f"DSC {r}" for r in regions)
        + " | precision | recall | LA W main | LA local share | affinity drift | s |"
    )
    print("|---" * (len(regions) + 7) + "|")
    for arm, row in rows.items():
        cells = [f"{100 * row['dsc'][r]:.1f}" for r in regions]
        cells += [f"{100 * row[m]:.1f}" for m in ("precision", "recall")]
        extra = [
            f"{row[k]:.4f}" if k in row else "-"
            for k in ("la_main_mean", "la_main_local_share", "affinity_drift")
        ]
        print(f"| {arm} | " + " | ".join(cells + extra) + f" | {row['seconds']:.0f} |")
    print(
        f"\nbrain {args.size} px, {args.per_site} images/site, annotations {ANNOTATIONS}, "
        f"{args.rounds} rounds x {args.iters} iters, batch {args.batch_size}, AdamW lr "
        f"{args.lr} poly, seed {args.seed}; total {time.perf_counter() - start:.0f} s on "
        f"{platform.processor() or platform.machine()}, 1 thread"
    )


if __name__ == "__main__":
    main()
