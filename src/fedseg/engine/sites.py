"""Site data held by an engine: loading from a federation folder, batches, contexts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedseg.data.transforms import Rotation, augment
from fedseg.errors import DataError
from fedseg.methods import ClientContext, FederationSpec, SiteSpec, TrainSettings

if TYPE_CHECKING:
    from fedseg.data import FederatedDataset

__all__ = [
    "POOLED",
    "LazySiteData",
    "SiteData",
    "batch_stream",
    "client_context",
    "derive_seed",
    "load_sites",
    "ordered_stream",
    "seeded",
]

POOLED = "pooled"
"""Name of the virtual site that pooled (centralized) methods train."""


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for ``(seed, *keys)``: each round and site gets an independent stream.

    The engines use ``(seed, round, site index)`` for client steps, ``(seed, round, -1)`` for
    server steps and ``(seed, -1, site index)`` for a site's initial state."""
    return int(
        np.random.SeedSequence([seed, *[k + 1 for k in keys]]).generate_state(2, np.uint64)[0] >> 1
    )


@contextmanager
def seeded(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Run the block with torch's global RNG (and the CUDA one of ``device``) seeded with
    ``seed``; the RNG state outside the block is left as it was. Modules that draw from the
    global RNG (weight initialisation, dropout) are thereby reproducible per step."""
    cuda = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


EvalSplit = tuple[torch.Tensor, torch.Tensor, list[str], list[tuple[float, ...]] | None]
"""Images, full masks, sample ids and spacing of a split evaluation scores."""


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
    val_eval: EvalSplit | None = None
    """The validation split with full masks (images, masks, ids, spacing), scored by the
    periodic evaluation during training; None when the site has no validation split."""

    def scored(self, split: str) -> SiteData | None:
        """This site with ``split`` (``test`` or ``val``) as the data evaluation scores;
        None when the site has no such split."""
        if split == "test":
            return self
        if self.val_eval is None:
            return None
        images, masks, ids, spacing = self.val_eval
        return replace(
            self, test_images=images, test_masks=masks, test_ids=ids, test_spacing=spacing
        )

    def release(self) -> None:
        """Drop tensors that can be read again (nothing: this site is held in memory)."""


class LazySiteData(SiteData):
    """A site whose tensors are read from its federation folder when first used and dropped
    by :meth:`release` (``data.lazy``): an engine then holds one site's data at a time.

    Pickles without its tensors, so worker processes read the site themselves."""

    def __init__(self, spec: SiteSpec, load: Callable[[], SiteData]) -> None:
        self.spec, self._load = spec, load
        self._data: SiteData | None = None

    def loaded(self) -> SiteData:
        """The site's data, read now if it is not in memory."""
        if self._data is None:
            self._data = self._load()
        return self._data

    def scored(self, split: str) -> SiteData | None:
        return self.loaded().scored(split)

    def release(self) -> None:
        self._data = None

    def __getstate__(self) -> dict[str, object]:
        return {"spec": self.spec, "_load": self._load, "_data": None}


def _lazy_field(name: str) -> property:
    return property(lambda self: getattr(self.loaded(), name))


for _name in (f.name for f in fields(SiteData) if f.name != "spec"):
    setattr(LazySiteData, _name, _lazy_field(_name))


def load_sites(
    fed: FederatedDataset,
    labels: str,
    names: list[str] | None = None,
    eval_split: str = "test",
    lazy: bool = False,
) -> tuple[FederationSpec, dict[str, SiteData]]:
    """The chosen sites of ``fed`` (in memory, or with ``lazy`` read when used) and the
    federation they form."""
    m = fed.manifest
    known = {s.name: s for s in m.sites}
    chosen = names or [s.name for s in m.sites]
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise DataError(f"{fed.root}: data.sites names unknown sites {unknown}; have {list(known)}")
    sites: dict[str, SiteData] = {}
    for i, name in enumerate(chosen):
        info = known[name]
        num_train = len(fed.ids(name, "train"))
        if num_train == 0:
            raise DataError(f"{fed.root}: site {name!r} has no training samples")
        spec = SiteSpec(name, i, num_train, info.annotation, info.sparsity)
        load = partial(_read_site, fed, spec, labels, eval_split)
        sites[name] = LazySiteData(spec, load) if lazy else load()
    spec = FederationSpec(
        in_channels=m.channels,
        num_classes=m.num_classes,
        ndim=m.ndim,
        ignore_index=m.ignore_index,
        labels=labels,
        sites=tuple(s.spec for s in sites.values()),
        image_size=tuple(m.spatial_shape),
    )
    return spec, sites


def _read_site(fed: FederatedDataset, spec: SiteSpec, labels: str, eval_split: str) -> SiteData:
    name = spec.name
    train = fed.load(name, "train", labels)
    has_val = bool(fed.manifest.site(name).splits.get("val", 0))
    val = fed.load(name, "val", labels) if has_val else None
    test = fed.load(name, eval_split, "full")
    full_val = fed.load(name, "val", "full") if has_val else None
    return SiteData(
        spec,
        train.images,
        train.labels,
        (val.images, val.labels) if val is not None else None,
        test.images,
        test.masks,
        list(test.ids),
        test.spacing,
        None
        if full_val is None
        else (full_val.images, full_val.masks, list(full_val.ids), full_val.spacing),
    )


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
    drop_last: bool = True,
    rotation: Rotation = "right_angles",
    ignore_index: int = 255,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled batches (a new permutation each pass), optionally augmented.

    ``drop_last`` (iteration mode) skips a pass's incomplete last batch so that every batch
    has the same size; without it (epoch mode) every sample is seen once per pass."""
    n = len(images)
    size = min(batch_size, n)
    while True:
        order = torch.randperm(n, generator=generator)
        stop = n - size + 1 if drop_last else n
        for start in range(0, stop, size):
            idx = order[start : start + size]
            x, y = images[idx], labels[idx]
            if augment_batches:
                x, y = augment(x, y, generator, rotation=rotation, ignore_index=ignore_index)
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def ordered_stream(
    images: torch.Tensor, labels: torch.Tensor, batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass over the samples in stored order, un-augmented."""
    for start in range(0, len(images), batch_size):
        yield (
            images[start : start + batch_size].to(device, non_blocking=True),
            labels[start : start + batch_size].to(device, non_blocking=True),
        )


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
    """The context of one client step; its generator (batch order, augmentation, method
    sampling) is derived from (seed, round, site), so a step is reproducible wherever and
    whenever it runs. The caller seeds torch's global RNG the same way (:func:`seeded`)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, round_index, site.spec.index))
    batches = batch_stream(
        site.train_images,
        site.train_labels,
        train.batch_size,
        gen,
        augment_batches=train.augment,
        device=device,
        drop_last=train.local_epochs is None,
        rotation=train.rotation,
        ignore_index=spec.ignore_index,
    )
    val = None
    if site.val is not None:
        val = (site.val[0].to(device), site.val[1].to(device))

    def ordered(batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return ordered_stream(site.train_images, site.train_labels, batch_size, device)

    return ClientContext(
        site.spec, spec, round_index, train, model, batches, device, gen, val, ordered
    )
