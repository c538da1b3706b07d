"""What keeps FedLPPA's prompt affinity near its random start, measured on finished runs.

    python benchmarks/fedlppa_prompt_bounds.py RUN_DIR [RUN_DIR ...] [--out DIR]

For each FedLPPA run directory (with ``checkpoints/last.pt``) it rebuilds the run's initial
network from its config and seed (the same weights every engine starts from) and compares its
prompts with the aggregated prompts of the last checkpoint:

- **affinity at initialisation** (Eqs. 7-8 on the initial DDP slots and UKP), at the last
  round as the server computed it (``rounds.jsonl``, uploaded slots) and on the aggregated
  slots of the checkpoint; the off-diagonal range of each;
- **the same cosine without the shared UKP and without the prompts' mean** (Pearson
  correlation of the DDP slots): what the sites' own slots say once the terms every pair
  shares are removed;
- **whether the site pairs keep their initial order**: Spearman correlation of the pairs'
  affinities at initialisation and at the last round (1: the ordering is the random start's);
- **how far the prompts moved**: per DDP slot and for the UKP, ``||p_T - p_0|| / ||p_0||``
  and the largest entry change, against the **ceiling** an Adam-type optimiser allows, the
  sum of the learning rates over the site's local steps (each step moves an entry by at most
  about ``lr``) times the site's sample share ``n_i / n`` that survives FedAvg (Eq. 2);
- **the paper's premise**: each pair of sites with the same annotation family (``scribble``
  and ``scribble2``), its affinity rank among all pairs at initialisation and at the last
  round (a pair that is closest at the end but was already closest at the start learnt
  nothing).

Writes ``bounds.md`` (and prints it). Nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from fedlppa_prompts import (  # the sibling script (benchmarks/ is on sys.path)
    family_pair_ranks,
    rank_agreement,
)

from fedseg.engine.worker import initial_model
from fedseg.inference import RunModels
from fedseg.methods.base import round_lr, round_steps
from fedseg.models.tdf import prompt_affinity
from fedseg.reporting.runs import site_facts


def pearson(ddp: torch.Tensor) -> torch.Tensor:
    """Correlation between DDP slots: cosine after removing each slot's mean."""
    x = ddp.detach().double().flatten(1)
    x = x - x.mean(dim=1, keepdim=True)
    x = torch.nn.functional.normalize(x, dim=1)
    return (x @ x.T).float()


def off_diagonal(m: torch.Tensor) -> tuple[float, float, float]:
    """(min, mean, max) of the off-diagonal entries."""
    mask = ~torch.eye(len(m), dtype=torch.bool)
    v = m[mask]
    return float(v.min()), float(v.mean()), float(v.max())


def lr_sum(train: Any, steps_per_round: int) -> float:
    """Sum of the learning rate over one site's local steps of the whole run."""
    return sum(round_lr(train, r) * steps_per_round for r in range(train.rounds))


def analyse(run_dir: Path) -> dict[str, Any]:
    run = RunModels(run_dir)
    cfg, spec, method = run.cfg, run.spec, run.method
    tdf0 = initial_model(method, cfg.seed).tdf
    if tdf0 is None:
        raise SystemExit(f"{run_dir}: FedLPPA without TDF has no prompts")
    ddp0, ukp0 = tdf0.ddp.detach(), tdf0.ukp.detach() if tdf0.ukp is not None else None
    tensors = run.server.payloads[spec.site_names[0]].tensors
    ddp, ukp = tensors["tdf.ddp"], tensors.get("tdf.ukp")
    records = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines() if x]
    last = [r["server"] for r in records if "affinity" in r.get("server", {})][-1]
    n = sum(s.num_train for s in spec.sites)
    slots = []
    for s in spec.sites:
        d0, d1 = ddp0[s.index], ddp[s.index]
        slots.append(
            {
                "site": s.name,
                "share": s.num_train / n,
                "rel": float((d1 - d0).norm() / d0.norm()),
                "max": float((d1 - d0).abs().max()),
                "steps": round_steps(cfg.train, s.num_train),
                "ceiling": lr_sum(cfg.train, round_steps(cfg.train, s.num_train)) * s.num_train / n,
            }
        )
    return {
        "dir": run_dir,
        "shape": tuple(ddp0.shape[1:]),
        "init": off_diagonal(prompt_affinity(ddp0, ukp0)),
        "uploaded": off_diagonal(torch.tensor(last["affinity"])),
        "order_kept": rank_agreement(prompt_affinity(ddp0, ukp0), torch.tensor(last["affinity"])),
        "family_ranks": family_pair_ranks(
            [s.name for s in spec.sites],
            {k: f.annotation for k, f in site_facts(run_dir).items()},
            prompt_affinity(ddp0, ukp0),
            torch.tensor(last["affinity"]),
        ),
        "aggregated": off_diagonal(prompt_affinity(ddp, ukp)),
        "pearson0": off_diagonal(pearson(ddp0)),
        "pearson": off_diagonal(pearson(ddp)),
        "slots": slots,
        "ukp": None
        if ukp0 is None
        else (float((ukp - ukp0).norm() / ukp0.norm()), float((ukp - ukp0).abs().max())),
        "ceiling": max(lr_sum(cfg.train, x["steps"]) for x in slots),
        "rounds": cfg.train.rounds,
    }


def _r(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.3f} / {t[1]:.3f} / {t[2]:.3f}"


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "# FedLPPA: what bounds the prompts' movement",
        "",
        "Off-diagonal entries as min / mean / max. Ceiling: sum of the learning rate over the "
        "site's local steps times its sample share (Adam-type steps move an entry by at most "
        "about lr; FedAvg keeps n_i / n of a site's change to its own slot).",
        "",
        "| run | DDP slot | rounds | affinity at init | last round (uploaded) "
        "| last (aggregated) | DDP correlation at init | DDP correlation last "
        "| pair order kept (Spearman, init vs last) "
        "| same-family pairs: affinity rank at init -> last (1 = closest) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['dir']} | {'x'.join(map(str, run['shape']))} | {run['rounds']} "
            f"| {_r(run['init'])} | {_r(run['uploaded'])} | "
            f"{_r(run['aggregated'])} | {_r(run['pearson0'])} | {_r(run['pearson'])} "
            f"| {run['order_kept']:.2f} | {'; '.join(run['family_ranks']) or 'none'} |"
        )
    lines += [
        "",
        "| run | site | n_i / n | steps per round | DDP slot moved (rel. L2) "
        "| largest entry change | ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for s in run["slots"]:
            lines.append(
                f"| {run['dir'].name} | {s['site']} | {s['share']:.2f} | {s['steps']} "
                f"| {s['rel']:.3f} | {s['max']:.3f} | {s['ceiling']:.3f} |"
            )
        if run["ukp"] is not None:
            rel, big = run["ukp"]
            lines.append(
                f"| {run['dir'].name} | UKP | 1 | | {rel:.3f} | {big:.3f} | {run['ceiling']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FedLPPA run directories")
    ap.add_argument("--out", type=Path, help="folder for bounds.md")
    args = ap.parse_args()
    text = markdown([analyse(d) for d in args.runs])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bounds.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
