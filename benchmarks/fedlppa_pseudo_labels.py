"""How good are FedLPPA's pseudo-labels (Eq. 14) on the pixels the weak labels leave open?

    OMP_NUM_THREADS=1 python benchmarks/fedlppa_pseudo_labels.py --config fedlppa/table7_full \
        --data runs/fedlppa-ablation-30r/seed0/data/faz --rounds 30 --out runs/pl-probe-full

Runs one shipped FedLPPA config (with PD) in-process and, at every dual-decoder loss
evaluation (local steps and LA steps), scores the pseudo-label the loss trains against with
the site's full mask, on the pixels whose weak label is "unlabelled": pixel accuracy, and
the foreground Dice of the pseudo-label against the mask there. The method never sees the
masks. The benchmark passes them alongside the weak labels. Each training label is encoded
as ``weak + 16 * mask``, so flips and rotations move both alike. The loss wrapper decodes
them before FedLPPA's loss. Prints the mean per round over sites and steps, and writes
``OUT/pseudo_labels.json``. Diagnostic only: it measures; it changes nothing in training.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

import fedseg.engine.sites as sites_module
import fedseg.methods.fedlppa as fedlppa_module
from fedseg.config import load_config, method_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.worker import SiteWorker
from fedseg.methods.pseudo_label import pseudo_label

UNLABELLED, SHIFT = 15, 16
"""Encoding of a training label: ``weak + SHIFT * mask``; weak ``ignore_index`` -> UNLABELLED."""


def encode(weak: torch.Tensor, mask: torch.Tensor, ignore_index: int) -> torch.Tensor:
    if int(mask.max()) >= UNLABELLED:
        raise SystemExit("the probe encodes masks of at most 15 classes")
    return torch.where(weak == ignore_index, UNLABELLED, weak) + SHIFT * mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="fedlppa/table7_full")
    ap.add_argument("--data", type=Path, required=True, help="federation folder (data.root)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--local-iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config(
        args.config,
        [
            f"train.rounds={args.rounds}",
            f"train.local_iters={args.local_iters}",
            f"data.root={args.data.resolve()}",
            f"seed={args.seed}",
        ],
    )
    if not method_config(cfg.method).model_dump().get("pd", True):
        raise SystemExit(f"{args.config} has no dual decoder (pd: false): nothing to probe")
    read_site = sites_module._read_site

    def read_with_masks(fed, spec, labels, eval_split):  # type: ignore[no-untyped-def]
        data = read_site(fed, spec, labels, eval_split)
        masks = fed.load(spec.name, "train", "full").masks.to(data.train_labels.dtype)
        data.train_labels = encode(data.train_labels, masks, fed.manifest.ignore_index)
        return data

    now: dict[str, Any] = {}
    train = SiteWorker.train

    def train_noting_site(self, r, payload):  # type: ignore[no-untyped-def]
        now.update(site=self.name, round=r + 1)
        return train(self, r, payload)

    scores: dict[int, list[dict[str, float]]] = defaultdict(list)
    loss = fedlppa_module.dual_decoder_loss

    def probed_loss(main, aux, labels, *, ignore_index, **kw):  # type: ignore[no-untyped-def]
        weak, mask = labels % SHIFT, labels // SHIFT
        weak = torch.where(weak == UNLABELLED, ignore_index, weak)
        value, parts = loss(main, aux, weak, ignore_index=ignore_index, **kw)
        target = pseudo_label(main.detach(), aux.detach(), parts["mix"])
        open_ = (weak == ignore_index) & (mask != UNLABELLED)
        if bool(open_.any()):
            t, m = target[open_], mask[open_]
            fg_t, fg_m = t > 0, m > 0
            inter = float((fg_t & fg_m).sum())
            denom = float(fg_t.sum() + fg_m.sum())
            scores[now["round"]].append(
                {
                    "site": now["site"],
                    "accuracy": float((t == m).float().mean()),
                    "fg_dice": 2 * inter / denom if denom else 1.0,
                    "open_share": float(open_.float().mean()),
                }
            )
        return value, parts

    sites_module._read_site = read_with_masks
    SiteWorker.train = train_noting_site
    fedlppa_module.dual_decoder_loss = probed_loss
    res = InProcessRunner(cfg, args.out / "run").run()
    per_round = {
        r: {k: statistics.fmean(s[k] for s in rows) for k in ("accuracy", "fg_dice", "open_share")}
        for r, rows in sorted(scores.items())
    }
    (args.out / "pseudo_labels.json").write_text(json.dumps({"per_round": per_round}, indent=1))
    dsc = statistics.fmean(next(iter(v["dsc"].values())) for v in res["sites"].values())
    print(f"{args.config}, {args.rounds} rounds x {args.local_iters}, seed {args.seed}: ")
    print(f"final test DSC (mean over sites) {100 * dsc:.1f}\n")
    print("| round | pseudo-label accuracy on unlabelled pixels | foreground Dice there |")
    print("|---|---|---|")
    for r, v in per_round.items():
        print(f"| {r} | {100 * v['accuracy']:.1f} | {100 * v['fg_dice']:.1f} |")


if __name__ == "__main__":
    main()
