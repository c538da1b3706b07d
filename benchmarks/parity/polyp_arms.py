"""The fedseg arms' run configs of the polyp parity table (virtual-class Table I's federation).

    .venv/bin/python benchmarks/parity/polyp_arms.py --out runs/parity/polyp-configs
    .venv/bin/fedseg run runs/parity/polyp-configs/fedseg-fedavg-s0.yaml \
        --out runs/parity/polyp/fedseg-fedavg/seed0

Every arm trains what the code's runs train (``pflseg.py``): 20 rounds of 38 steps of 8
images, Adam at 1e-3, no augmentation, PVTv2-b0 + FPN from the code's initial weights of the
seed (``pflseg.py --weights-only`` writes them to ``runs/parity/work/pflseg-ours_q-s<seed>``),
on the federation and evaluation of the table's kept runs. The baselines and ``fedseg-feddp``
are fedseg's defaults; ``fedseg-authors-feddp`` is ``method.variant: authors``, which fixes
its own ``train:`` and ``model:`` settings. ``eval.save_models`` is off, as the arms ran: the
parity table reads ``cases.csv`` alone (and until 2026-12-05 the export repeated a
fine-tuning method's fine-tuning).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

KEPT = Path(__file__).resolve().parents[2] / "docs/evidence/parity/vc-table1-polyp/runs"
BASE = KEPT / "fedseg-fedavg-smp/seed0/config.yaml"
"""A kept arm's config: the federation (``data``), the evaluation and the budget."""
ARMS: dict[str, dict[str, object]] = {
    "fedseg-fedavg": {"name": "fedavg"},
    "fedseg-fedrep": {"name": "fedrep"},
    "fedseg-fedbabu": {"name": "fedbabu"},
    "fedseg-feddp": {"name": "feddp", "ft_epochs": 5},
    "fedseg-authors-feddp": {"name": "feddp", "variant": "authors", "ft_epochs": 5},
}
BUDGET = {"rounds": 20, "local_iters": 38, "batch_size": 8, "optimizer": "adam", "lr": 1e-3}


def arm_config(arm: str, seed: int) -> dict[str, object]:
    """The run config of ``arm`` (a key of :data:`ARMS`) at ``seed``."""
    base = yaml.safe_load(BASE.read_text())
    method = copy.deepcopy(ARMS[arm])
    weights = f"runs/parity/work/pflseg-ours_q-s{seed}/pvt_v2_b0.pth"
    train = {"augment": False, "lr_schedule": "constant", "weight_decay": 0.0, **BUDGET}
    if method.get("variant") == "authors":  # the variant sets its own train settings
        train = {k: v for k, v in train.items() if k in ("rounds", "lr", "augment")}
    return {
        "name": f"parity-pflseg-{arm}",
        "seed": seed,
        "data": base["data"],
        "method": method,
        "model": {"name": "pvtv2_fpn", "weights": weights},
        "train": train,
        "eval": {**base["eval"], "save_models": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/parity/polyp-configs"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for arm in ARMS:
        for seed in args.seeds:
            path = args.out / f"{arm}-s{seed}.yaml"
            path.write_text(yaml.safe_dump(arm_config(arm, seed), sort_keys=False))
            print(path)


if __name__ == "__main__":
    main()
