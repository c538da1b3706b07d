"""Site data held by an engine: loading from a federation folder, batches, contexts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedseg.data.transforms import augment
from fedseg.errors import DataError
from fedseg.methods import ClientContext, FederationSpec, SiteSpec, TrainSettings

if TYPE_CHECKING:
    from fedseg.data import FederatedDataset

__all__ = ["POOLED", "SiteData", "batch_stream", "client_context", "derive_seed", "load_sites"]

POOLED = "pooled"
"""Name of the virtual site that pooled (centralized) methods train."""


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for ``(seed, *keys)``: each round and site gets an independent stream."""
    return int(
        np.random.SeedSequence([seed, *[k + 1 for k in keys]]).generate_state(2, np.uint64)[0] >> 1
    )


@dataclass
class SiteData:
    """A site's tensors on the CPU: training labels (weak or full) and full test masks."""

    spec: SiteSpec
    train_images: torch.Tensor
    train_labels: torch.Tensor
    val: tuple[torch.Tensor, torch.Tensor] | None
    test_images: torch.Tensor
    test_masks: torch.Tensor
    test_ids: list[str]
    test_spacing: list[tuple[float, ...]] | None


def load_sites(
    fed: FederatedDataset, labels: str, names: list[str] | None = None, eval_split: str = "test"
) -> tuple[FederationSpec, dict[str, SiteData]]:
    """Load the chosen sites of ``fed`` into memory and describe the federation."""
    m = fed.manifest
    known = {s.name: s for s in m.sites}
    chosen = names or [s.name for s in m.sites]
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise DataError(f"{fed.root}: data.sites names unknown sites {unknown}; have {list(known)}")
    sites: dict[str, SiteData] = {}
    for i, name in enumerate(chosen):
        info = known[name]
        train = fed.load(name, "train", labels)
        if len(train.ids) == 0:
            raise DataError(f"{fed.root}: site {name!r} has no training samples")
        val = fed.load(name, "val", labels) if info.splits.get("val", 0) else None
        test = fed.load(name, eval_split, "full")
        spec = SiteSpec(name, i, len(train.ids), info.annotation, info.sparsity)
        sites[name] = SiteData(
            spec,
            train.images,
            train.labels,
            (val.images, val.labels) if val is not None else None,
            test.images,
            test.masks,
            list(test.ids),
            test.spacing,
        )
    first = next(iter(sites.values()))
    spec = FederationSpec(
        in_channels=m.channels,
        num_classes=m.num_classes,
        ndim=m.ndim,
        ignore_index=m.ignore_index,
        labels=labels,
        sites=tuple(s.spec for s in sites.values()),
        image_size=tuple(first.train_images.shape[2:]),
    )
    return spec, sites


def pooled_site(sites: dict[str, SiteData]) -> SiteData:
    """One virtual site holding every site's training (and validation) data."""
    parts = list(sites.values())
    vals = [p.val for p in parts if p.val is not None]
    val = (torch.cat([v[0] for v in vals]), torch.cat([v[1] for v in vals])) if vals else None
    images = torch.cat([p.train_images for p in parts])
    spec = SiteSpec(POOLED, 0, len(images), "pooled", None)
    empty = parts[0].test_images[:0]
    return SiteData(
        spec,
        images,
        torch.cat([p.train_labels for p in parts]),
        val,
        empty,
        parts[0].test_masks[:0],
        [],
        None,
    )


def batch_stream(
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
    *,
    augment_batches: bool,
    device: torch.device,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled batches (a new permutation each pass), optionally augmented."""
    n = len(images)
    size = min(batch_size, n)
    while True:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - size + 1, size):
            idx = order[start : start + size]
            x, y = images[idx], labels[idx]
            if augment_batches:
                x, y = augment(x, y, generator)
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def client_context(
    site: SiteData,
    spec: FederationSpec,
    train: TrainSettings,
    *,
    round_index: int,
    seed: int,
    model: nn.Module,
    device: torch.device,
) -> ClientContext:
    """The context of one client step, with every random stream derived from (seed, round,
    site) so that a step is reproducible wherever and whenever it runs."""
    step_seed = derive_seed(seed, round_index, site.spec.index)
    torch.manual_seed(step_seed)
    gen = torch.Generator().manual_seed(step_seed)
    batches = batch_stream(
        site.train_images,
        site.train_labels,
        train.batch_size,
        gen,
        augment_batches=train.augment,
        device=device,
    )
    val = None
    if site.val is not None:
        val = (site.val[0].to(device), site.val[1].to(device))
    return ClientContext(site.spec, spec, round_index, train, model, batches, device, gen, val)
