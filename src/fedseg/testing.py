"""Toy federations for tests of methods and engines (no network).

:func:`toy_federation` is in memory: each site holds random images with one bright disc per
image whose brightness and contrast depend on the site, full masks, and sparse "weak" labels
(a few labeled pixels per class). :func:`synth_folder` writes a small synthetic federation
folder with weak labels, as ``fedseg data synth`` does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedseg.engine.sites import SiteData
from fedseg.methods import FederationSpec, SiteSpec

__all__ = ["synth_folder", "toy_federation"]

ANNOTATIONS = ("scribble", "point", "block", "scribble2", "box")
SPARSITY = {
    "point": "sparse",
    "scribble": "medium",
    "scribble2": "medium",
    "block": "dense",
    "box": "dense",
    "full": None,
}


def _site(
    index: int,
    n: int,
    size: int,
    ndim: int,
    channels: int,
    num_classes: int,
    labels: str,
    ignore: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = (size,) * ndim
    grids = torch.meshgrid(*[torch.arange(size, dtype=torch.float32)] * ndim, indexing="ij")
    masks = torch.zeros((n, *shape), dtype=torch.long)
    for i in range(n):
        centre = torch.rand(ndim, generator=gen) * size * 0.5 + size * 0.25
        radius = size * (0.15 + 0.1 * float(torch.rand(1, generator=gen)))
        dist = torch.sqrt(sum((g - c) ** 2 for g, c in zip(grids, centre, strict=True)))
        for k in range(1, num_classes):
            masks[i][dist < radius * (1 - (k - 1) / num_classes)] = k
    contrast = 1.0 + 0.5 * index
    images = masks.unsqueeze(1).float().repeat(1, channels, *[1] * ndim) * contrast
    images = images + 0.3 * torch.randn(images.shape, generator=gen) + 0.2 * index
    if labels == "full":
        return images, masks, masks.clone()
    keep = torch.rand(masks.shape, generator=gen) < 0.05
    weak = torch.where(keep, masks, torch.full_like(masks, ignore))
    return images, weak, masks


def toy_federation(
    num_sites: int = 2,
    *,
    n_train: int = 8,
    n_test: int = 4,
    size: int = 32,
    ndim: int = 2,
    channels: int = 1,
    num_classes: int = 2,
    labels: str = "weak",
    with_val: bool = False,
    seed: int = 0,
) -> tuple[FederationSpec, dict[str, SiteData]]:
    """A tiny federation: ``(spec, {site name: SiteData})`` with site-dependent appearance."""
    gen = torch.Generator().manual_seed(seed)
    ignore = 255
    sites = {}
    for i in range(num_sites):
        name = f"site{i}"
        ann = "full" if labels == "full" else ANNOTATIONS[i % len(ANNOTATIONS)]
        n = n_train + i * 2
        tr_x, tr_y, _ = _site(i, n, size, ndim, channels, num_classes, labels, ignore, gen)
        te_x, _, te_m = _site(i, n_test, size, ndim, channels, num_classes, "full", ignore, gen)
        val = None
        if with_val:
            vx, vy, _ = _site(i, 4, size, ndim, channels, num_classes, labels, ignore, gen)
            val = (vx, vy)
        spec = SiteSpec(name, i, n, ann, SPARSITY[ann])
        sites[name] = SiteData(
            spec, tr_x, tr_y, val, te_x, te_m, [f"{name}-{j}" for j in range(n_test)], None
        )
    fed = FederationSpec(
        in_channels=channels,
        num_classes=num_classes,
        ndim=ndim,
        ignore_index=ignore,
        labels=labels,
        sites=tuple(s.spec for s in sites.values()),
        image_size=(size,) * ndim,
    )
    return fed, sites


def synth_folder(
    root: Path, task: str, *, sites: int = 3, size: int = 32, per_site: int = 10
) -> Path:
    """A synthetic ``task`` federation of ``sites`` sites with weak labels in ``root``
    (seed 0); returns ``root``."""
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    synthesize(task, root, sites=sites, size=size, per_site=per_site, seed=0)
    generate_weak_labels(root, seed=0)
    return root
