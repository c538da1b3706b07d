"""How much class structure a finished run's features carry on its test cases.

    python benchmarks/feature_structure.py \
        runs/reproduce/fedbcs-table1-prostate-evidence/{feduv,fpl}/seed0 --level dec1

For every run (a run directory with its checkpoint and data) and site, the site's evaluation
model runs on the site's test images; from the features at ``--level`` a sample of labelled
pixels (at most ``--pixels`` per class, every class weighing the same,
:mod:`fedseg.methods.balanced`) gives

- ``unif``: FedUV's uniformity term (:func:`fedseg.methods.feduv.uniformity_loss`, without
  its weight), lowest when the features carry no class structure;
- ``separation``: the between-class scatter over the within-class scatter (traces, the class
  weights of the sample), 0 when the classes share one mean;
- per class ``c``: ``norm c``, the mean Euclidean norm of the sampled features, and ``zero c``,
  the fraction of them that are the zero vector (a collapsed class after a ReLU), and
  ``p99 c``, the 99th percentile of the predicted probability of class ``c`` over every test
  pixel of that class (below 1/K the argmax cannot pick it).

Prints a markdown table of per-site values and the mean over sites. Nothing is trained; it
reads checkpoints (kept under ``runs/``, not in ``docs/evidence``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from fedseg.inference import RunModels
from fedseg.methods.balanced import pixel_weights, sample_pixels
from fedseg.methods.feduv import uniformity_loss
from fedseg.models.features import named_features


def separation(z: torch.Tensor, classes: torch.Tensor, weights: torch.Tensor) -> float:
    """Trace of the weighted between-class scatter over that of the within-class scatter."""
    mean = (weights[:, None] * z).sum(0)
    between = within = 0.0
    for c in classes.unique():
        at = classes == c
        wc = weights[at]
        mc = (wc[:, None] * z[at]).sum(0) / wc.sum()
        between += float(wc.sum() * (mc - mean).pow(2).sum())
        within += float((wc[:, None] * (z[at] - mc).pow(2)).sum())
    return between / within if within > 0 else float("inf")


def site_structure(
    runs: RunModels, site: str, level: str, pixels: int, seed: int
) -> dict[str, float]:
    """The measures above of ``site``'s test features at ``level``, by column name."""
    model = runs.site_model(site).model.float()
    data = runs.sites[site]
    with torch.no_grad():
        logits, feats = named_features(model, data.test_images.float(), [level])
    probs = logits.float().softmax(1).movedim(1, -1)
    k = runs.spec.num_classes
    z, y = sample_pixels(
        feats[level], data.test_masks, k, pixels, torch.Generator().manual_seed(seed)
    )
    w = pixel_weights(y)
    z = z.float()
    values = {"unif": float(uniformity_loss(z, w)), "separation": separation(z, y, w)}
    for c in range(k):
        norms = z[y == c].norm(dim=1)
        values[f"norm {c}"] = float(norms.mean()) if len(norms) else float("nan")
        values[f"zero {c}"] = float((norms == 0).float().mean()) if len(norms) else float("nan")
        own = probs[data.test_masks == c][:, c]
        values[f"p99 {c}"] = float(np.quantile(own.numpy(), 0.99)) if len(own) else float("nan")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--level", default="dec1", help="feature name (default dec1)")
    parser.add_argument("--pixels", type=int, default=512, help="pixels per class (512)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pixel sample")
    args = parser.parse_args()
    header = False
    for run_dir in args.runs:
        runs = RunModels(run_dir)
        values = {
            s: site_structure(runs, s, args.level, args.pixels, args.seed) for s in runs.site_names
        }
        columns = list(next(iter(values.values())))
        if not header:
            print("| run | site | " + " | ".join(columns) + " |")
            print("|---" * (len(columns) + 2) + "|")
            header = True
        values["mean"] = {c: statistics.mean(v[c] for v in values.values()) for c in columns}
        for site, row in values.items():
            print(f"| {run_dir} | {site} | " + " | ".join(f"{row[c]:.3g}" for c in columns) + " |")


if __name__ == "__main__":
    main()
