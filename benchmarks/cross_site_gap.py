"""Cross-site generalisation gap of a federation: a control of its site shift that involves
no federated method.

Usage: python benchmarks/cross_site_gap.py CONFIG [--set key=value ...] [--out FILE.json]

For every site *s* of CONFIG's federation one plain network (CONFIG's ``model``, fresh and
identically initialised for every site) is trained on *s* alone with CONFIG's ``train``
settings (the ``local`` method's training: ``train.rounds`` rounds of the configured local
steps, the optimiser state kept across rounds when configured); then every site's network is
evaluated on every site's test split. Printed and written: the Dice matrix (rows: trained on,
columns: tested on; foreground Dice x 100, mean over the foreground regions), the gap
``Dice(s->s) - Dice(s->t)``, its mean off the diagonal, its largest value, and the gap
relative to the source's own Dice. See docs/benchmarks_fedbcs.md, "Calibration of the site
shift".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from fedseg.config import apply_overrides, parse_config
from fedseg.configs import resolve_config
from fedseg.data import FederatedDataset
from fedseg.engine.prepare import prepare_data
from fedseg.engine.runner import resolve_device
from fedseg.engine.server import make_method
from fedseg.engine.sites import SiteData, client_context, derive_seed, load_sites, seeded
from fedseg.evaluation import evaluate
from fedseg.methods.training import train_steps


def train_site(
    cfg: Any, site: SiteData, spec: Any, device: torch.device
) -> tuple[torch.nn.Module, float]:
    """A fresh network (seeded from ``cfg.seed`` only, so every site starts alike) trained
    on ``site`` alone; returns it and the mean training loss of the last round."""
    method = make_method(cfg, spec)
    with seeded(cfg.seed):
        model = method.build_model().to(device)
    optimizer_state: dict[str, Any] = {}
    loss = float("nan")
    for r in range(cfg.train.rounds):
        ctx = client_context(
            site, spec, cfg.train, round_index=r, seed=cfg.seed, model=model, device=device
        )
        ctx.optimizer_state = optimizer_state
        with seeded(derive_seed(cfg.seed, r, site.spec.index), device):
            loss = train_steps(model, ctx)["loss"]
    return model, loss


def dice(
    model: torch.nn.Module,
    site: SiteData,
    regions: dict[str, list[int]],
    cfg: Any,
    device: torch.device,
) -> float:
    """Foreground Dice x 100 of ``model`` on ``site``'s test split (mean over regions)."""
    out = evaluate(
        model,
        site.test_images,
        site.test_masks,
        regions,
        batch_size=cfg.eval.batch_size,
        device=device,
    )
    values = out.metrics["dsc"]
    return 100.0 * sum(values.values()) / len(values)


def gap_summary(matrix: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Gaps ``D[s][s] - D[s][t]``, their mean and maximum off the diagonal, and per source
    the mean gap relative to ``D[s][s]``."""
    names = list(matrix)
    gaps = {s: {t: matrix[s][s] - matrix[s][t] for t in names} for s in names}
    off = [gaps[s][t] for s in names for t in names if s != t]
    relative = {
        s: (sum(gaps[s][t] for t in names if t != s) / (len(names) - 1)) / matrix[s][s]
        for s in names
        if matrix[s][s] > 0
    }
    worst = max(((s, t) for s in names for t in names if s != t), key=lambda p: gaps[p[0]][p[1]])
    return {
        "gap": gaps,
        "mean_gap": sum(off) / len(off),
        "max_gap": gaps[worst[0]][worst[1]],
        "max_pair": list(worst),
        "min_gap": min(off),
        "intra": {s: matrix[s][s] for s in names},
        "mean_intra": sum(matrix[s][s] for s in names) / len(names),
        "relative_gap": relative,
        "mean_relative_gap": sum(relative.values()) / max(len(relative), 1),
    }


def markdown(matrix: dict[str, dict[str, float]], summary: dict[str, Any]) -> str:
    names = list(matrix)
    lines = [
        "| trained on \\ tested on | " + " | ".join(names) + " | mean gap | relative |",
        "|---" * (len(names) + 3) + "|",
    ]
    for s in names:
        mean_gap = sum(summary["gap"][s][t] for t in names if t != s) / (len(names) - 1)
        rel = summary["relative_gap"].get(s)
        cells = [f"**{matrix[s][t]:.1f}**" if s == t else f"{matrix[s][t]:.1f}" for t in names]
        rel_text = f"{100 * rel:.0f} %" if rel is not None else "-"
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {mean_gap:.1f} | {rel_text} |")
    lines.append(
        f"\nmean intra-site Dice {summary['mean_intra']:.1f}; mean off-diagonal gap "
        f"{summary['mean_gap']:.1f} (min {summary['min_gap']:.1f}, max {summary['max_gap']:.1f} "
        f"for {summary['max_pair'][0]} -> {summary['max_pair'][1]}); mean relative gap "
        f"{100 * summary['mean_relative_gap']:.0f} %"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="key=value override of the config (repeatable)",
    )
    ap.add_argument("--out", type=Path, help="write the matrix and summary as JSON here")
    args = ap.parse_args()
    path = resolve_config(args.config)
    raw = yaml.safe_load(path.read_text()) or {}
    if any(o.startswith("train.local_iters=") for o in args.overrides):
        raw.get("train", {}).pop("local_epochs", None)  # iterations replace epochs
    raw = apply_overrides(raw, args.overrides)
    raw["method"] = {"name": "local"}
    cfg = parse_config(raw, str(path))
    device = resolve_device(cfg.engine.device)
    fed = FederatedDataset.open(prepare_data(cfg))
    spec, sites = load_sites(fed, cfg.data.labels, cfg.data.sites, cfg.eval.split)
    regions = {k: list(v) for k, v in fed.manifest.regions.items()}
    models, losses, seconds = {}, {}, {}
    for name, site in sites.items():
        start = time.process_time()
        models[name], losses[name] = train_site(cfg, site, spec, device)
        seconds[name] = time.process_time() - start
        print(
            f"{name}: trained, last-round loss {losses[name]:.3f}, {seconds[name]:.0f} CPU s",
            flush=True,
        )
    matrix = {s: {t: dice(models[s], sites[t], regions, cfg, device) for t in sites} for s in sites}
    summary = gap_summary(matrix)
    print(markdown(matrix, summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "config": str(args.config),
            "overrides": args.overrides,
            "matrix": matrix,
            "train_loss": losses,
            "cpu_seconds": seconds,
            **summary,
        }
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
