"""Reading a federation folder: ``FederatedDataset.open(root).load(site, split, labels)``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fedseg.data.manifest import SPLITS, Manifest, SiteInfo, read_manifest
from fedseg.errors import DataError

if TYPE_CHECKING:
    from fedseg.data.checks import Problem

__all__ = [
    "WEAK_HINT",
    "FederatedDataset",
    "SiteSplit",
    "sample_dir",
    "sample_ids",
    "weak_path",
]

WEAK_HINT = "run `fedseg data weak-labels DIR` to generate them"


def sample_dir(root: Path, site: str, split: str) -> Path:
    """Folder holding one site's split: ``root/sites/<site>/<split>``."""
    return Path(root) / "sites" / site / split


def weak_path(root: Path, site: str, split: str, sample_id: str) -> Path:
    """Weak-label file of one sample: ``sites/<site>/<split>/weak/<id>.npy``."""
    return sample_dir(root, site, split) / "weak" / f"{sample_id}.npy"


def sample_ids(root: Path, site: str, split: str) -> list[str]:
    """Sorted sample ids (``<id>.npz`` stems) of a split; [] when the folder is missing."""
    folder = sample_dir(root, site, split)
    return sorted(p.stem for p in folder.glob("*.npz")) if folder.is_dir() else []


@dataclass(frozen=True)
class SiteSplit:
    """One site's split in memory.

    ``labels`` is the training label (weak with ``ignore_index`` on unlabeled pixels, or the
    full mask itself); ``masks`` is always the full mask.
    """

    images: torch.Tensor
    """float32 [N, C, *spatial]."""
    labels: torch.Tensor
    """int64 [N, *spatial]."""
    masks: torch.Tensor
    """int64 [N, *spatial]."""
    ids: list[str]
    spacing: list[tuple[float, ...]] | None
    """Physical spacing per sample (same axis order as the arrays), None when unknown."""

    def __len__(self) -> int:
        return len(self.ids)


class FederatedDataset:
    """A federation folder with a validated manifest; see docs/data.md for the layout."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest

    @classmethod
    def open(cls, root: str | Path) -> FederatedDataset:
        """Open ``root`` and validate its ``manifest.json`` (DataError naming file and field)."""
        return cls(Path(root), read_manifest(Path(root)))

    @property
    def site_names(self) -> list[str]:
        """Site names in manifest order."""
        return self.manifest.site_names

    def check(
        self, batch_size: int | None = None, labels: Literal["full", "weak"] = "full"
    ) -> list[Problem]:
        """All problems of the folder (see ``fedseg.data.checks``); empty when valid."""
        from fedseg.data.checks import check_federation

        return check_federation(self, batch_size=batch_size, labels=labels)

    def ids(self, site: str, split: str) -> list[str]:
        """Sample ids of a split, checked against the manifest's split size."""
        info = self._split(site, split)
        ids = sample_ids(self.root, site, split)
        if len(ids) != info.splits[split]:
            raise DataError(
                f"{sample_dir(self.root, site, split)}: manifest says {info.splits[split]} "
                f"samples, found {len(ids)} .npz files; run `fedseg data check {self.root}`"
            )
        return ids

    def load(self, site: str, split: str, labels: Literal["full", "weak"] = "full") -> SiteSplit:
        """Load one site's split fully into memory.

        Raises:
            DataError: unknown site/split/labels, a file that does not match the manifest, or
                weak labels that were never generated (or are stale) for this site.
        """
        if labels not in ("full", "weak"):
            raise DataError(f"labels must be 'full' or 'weak', got {labels!r}")
        info = self._split(site, split)
        ids = self.ids(site, split)
        m = self.manifest
        images = np.empty((len(ids), m.channels, *m.spatial_shape), np.float32)
        masks = np.empty((len(ids), *m.spatial_shape), np.uint8)
        spacing: list[tuple[float, ...] | None] = []
        folder = sample_dir(self.root, site, split)
        for i, sid in enumerate(ids):
            images[i], masks[i], sp = self._read_sample(folder / f"{sid}.npz")
            spacing.append(sp)
        masks_t = torch.from_numpy(masks.astype(np.int64))
        if labels == "weak" and info.annotation != "full":
            labels_t = torch.from_numpy(self._read_weak(info, split, ids).astype(np.int64))
        else:
            labels_t = masks_t
        return SiteSplit(
            images=torch.from_numpy(images),
            labels=labels_t,
            masks=masks_t,
            ids=ids,
            spacing=_merge_spacing(spacing, folder),
        )

    def _split(self, site: str, split: str) -> SiteInfo:
        if split not in SPLITS:
            raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
        return self.manifest.site(site)

    def _read_sample(self, path: Path) -> tuple[np.ndarray, np.ndarray, tuple[float, ...] | None]:
        m = self.manifest
        try:
            with np.load(path) as z:
                image, mask = z["image"], z["mask"]
                spacing = tuple(float(s) for s in z["spacing"]) if "spacing" in z else None
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{path}: cannot read sample ({e})") from None
        if image.shape != (m.channels, *m.spatial_shape):
            raise DataError(
                f"{path}: image shape must be {(m.channels, *m.spatial_shape)} "
                f"(channels, *spatial_shape from the manifest), got {image.shape}"
            )
        if mask.shape != tuple(m.spatial_shape):
            raise DataError(f"{path}: mask shape must be {m.spatial_shape}, got {mask.shape}")
        return image, mask, spacing

    def _read_weak(self, info: SiteInfo, split: str, ids: list[str]) -> np.ndarray:
        record = self.manifest.weak_labels
        made_for = record.annotations.get(info.name) if record else None
        if made_for is None:
            raise DataError(f"{self.root}: site {info.name!r} has no weak labels; {WEAK_HINT}")
        if made_for != info.annotation:
            raise DataError(
                f"{self.root}: site {info.name!r} weak labels were made for {made_for!r} but the "
                f"manifest annotation is {info.annotation!r}; {WEAK_HINT}"
            )
        out = np.empty((len(ids), *self.manifest.spatial_shape), np.uint8)
        for i, sid in enumerate(ids):
            path = weak_path(self.root, info.name, split, sid)
            if not path.is_file():
                raise DataError(f"{path}: weak label missing; {WEAK_HINT}")
            weak = np.load(path)
            if weak.shape != out.shape[1:]:
                raise DataError(f"{path}: shape must be {out.shape[1:]}, got {weak.shape}")
            out[i] = weak
        return out


def _merge_spacing(
    spacing: list[tuple[float, ...] | None], folder: Path
) -> list[tuple[float, ...]] | None:
    known = [s for s in spacing if s is not None]
    if not known:
        return None
    if len(known) != len(spacing):
        raise DataError(f"{folder}: some samples carry 'spacing' and others do not")
    return known
