"""Reading a federation folder (``FederatedDataset.open(root).load(site, split, labels)``) and
the on-disk contract of its files (docs/data.md), shared by the checks, loading and writing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedseg.data.manifest import SPLITS, Manifest, SiteInfo, read_manifest
from fedseg.errors import DataError

__all__ = [
    "MAX_ABS_INTENSITY",
    "WEAK_HINT",
    "FederatedDataset",
    "SiteSplit",
    "image_problems",
    "label_problems",
    "read_npy",
    "read_npz",
    "sample_dir",
    "sample_ids",
    "sample_problems",
    "spacing_problems",
    "unreadable",
    "weak_path",
]

WEAK_HINT = "run `fedseg data weak-labels DIR` to generate them"
MAX_ABS_INTENSITY = 1e3
"""Largest absolute image value accepted. Images hold normalised intensities (the importers
and synthetic tasks write [0, 1]); anything larger is raw scanner data or garbage."""
_SAMPLE_KEYS = ("image", "mask", "spacing")


def sample_dir(root: Path, site: str, split: str) -> Path:
    """Folder holding one site's split: ``root/sites/<site>/<split>``."""
    return Path(root) / "sites" / site / split


def weak_path(root: Path, site: str, split: str, sample_id: str) -> Path:
    """Weak-label file of one sample: ``sites/<site>/<split>/weak/<id>.npy``."""
    return sample_dir(root, site, split) / "weak" / f"{sample_id}.npy"


def sample_ids(root: Path, site: str, split: str) -> list[str]:
    """Sorted sample ids (``<id>.npz`` regular files: a pipe would block reading) of a split;
    [] when the folder is missing."""
    folder = sample_dir(root, site, split)
    return sorted(p.stem for p in folder.glob("*.npz") if p.is_file()) if folder.is_dir() else []


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The ``image``, ``mask`` and (when present) ``spacing`` arrays of the sample ``path``.

    Raises:
        DataError: naming the file when it is empty, damaged, truncated, no ``.npz`` archive
            or lacks ``image`` or ``mask``.
    """
    try:
        z = np.load(path)
        if isinstance(z, np.lib.npyio.NpzFile):
            with z:
                keys = z.files
                arrays = {k: z[k] for k in _SAMPLE_KEYS if k in keys}
        else:
            keys = None
    except Exception as e:  # every way a damaged file fails to parse is that file's problem
        raise DataError(unreadable(path, e, "an .npz sample")) from None
    if keys is None:
        raise DataError(f"{path}: holds one .npy array; expected an .npz of 'image' and 'mask'")
    if "image" not in arrays or "mask" not in arrays:
        raise DataError(f"{path}: needs arrays 'image' and 'mask', has {sorted(keys)}")
    return arrays


def read_npy(path: Path) -> np.ndarray:
    """The array of the ``.npy`` file ``path`` (a weak label).

    Raises:
        DataError: naming the file when it is empty, damaged, truncated or no ``.npy`` array.
    """
    try:
        array = np.load(path)
    except Exception as e:  # every way a damaged file fails to parse is that file's problem
        raise DataError(unreadable(path, e, "a .npy array")) from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise DataError(f"{path}: is an .npz archive; expected a single .npy array")
    return array


def unreadable(path: Path, e: Exception, what: str) -> str:
    """One line saying that ``path`` cannot be read as ``what`` and why (``e``, shortened)."""
    if path.is_file() and path.stat().st_size == 0:
        detail = "empty file: 0 bytes"
    else:
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:160]
    return f"{path}: damaged or unreadable as {what} ({detail})"


def image_problems(image: np.ndarray, shape: tuple[int, ...]) -> list[str]:
    """What breaks the image contract: float32, ``shape`` (channels, *spatial), finite values
    within +-``MAX_ABS_INTENSITY``; [] when the image is valid."""
    if image.dtype != np.float32:
        return [f"image dtype must be float32 (normalised intensities), got {image.dtype}"]
    if image.shape != shape:
        if image.shape[1:] == shape[1:]:
            return [f"image has {image.shape[0]} channels, the manifest says channels={shape[0]}"]
        return [f"image shape must be {shape} (channels, *spatial_shape), got {image.shape}"]
    lo, hi = float(image.min()), float(image.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        count = int(np.count_nonzero(~np.isfinite(image)))
        return [f"image holds {count} non-finite values (NaN or inf); values must be finite"]
    if max(-lo, hi) > MAX_ABS_INTENSITY:
        return [
            f"image values must lie in [-{MAX_ABS_INTENSITY:g}, {MAX_ABS_INTENSITY:g}] "
            f"(normalised intensities, [0, 1] by convention), got [{lo:.4g}, {hi:.4g}]"
        ]
    return []


def label_problems(
    label: np.ndarray,
    shape: tuple[int, ...],
    num_classes: int,
    what: str = "mask",
    unlabeled: int | None = None,
) -> list[str]:
    """What breaks the label contract: an integer dtype, ``shape`` and values that are classes
    (or ``unlabeled``, for weak labels); [] when the label map is valid."""
    if not np.issubdtype(label.dtype, np.integer):
        return [f"{what} dtype must be an integer type (uint8), got {label.dtype}"]
    if label.shape != shape:
        return [f"{what} shape must be {shape}, got {label.shape}"]
    bad = (label < 0) | (label >= num_classes)
    if unlabeled is not None:
        bad &= label != unlabeled
    if not bad.any():
        return []
    allowed = f"classes 0..{num_classes - 1}"
    if unlabeled is not None:
        allowed += f" or {unlabeled} (unlabeled)"
    return [f"{what} values must be {allowed}, got {np.unique(label[bad])[:10].tolist()}"]


def spacing_problems(spacing: np.ndarray, ndim: int) -> list[str]:
    """What breaks the spacing contract: ``ndim`` finite positive numbers."""
    if (
        spacing.dtype.kind in "iuf"
        and spacing.shape == (ndim,)
        and np.isfinite(spacing).all()
        and (spacing > 0).all()
    ):
        return []
    got = spacing.tolist() if spacing.size <= 8 else f"{spacing.dtype} array {spacing.shape}"
    return [f"spacing must be {ndim} finite positive numbers (one per axis), got {got}"]


def sample_problems(arrays: dict[str, np.ndarray], m: Manifest) -> list[str]:
    """Every way the arrays of one sample (from :func:`read_npz`) break the on-disk contract
    of docs/data.md; [] when the sample is valid."""
    shape = tuple(m.spatial_shape)
    problems = image_problems(arrays["image"], (m.channels, *shape))
    problems += label_problems(arrays["mask"], shape, m.num_classes)
    if "spacing" in arrays:
        problems += spacing_problems(arrays["spacing"], m.ndim)
    return problems


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
            spacing=_merge_spacing(spacing, ids, folder),
        )

    def _split(self, site: str, split: str) -> SiteInfo:
        if split not in SPLITS:
            raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
        return self.manifest.site(site)

    def _read_sample(self, path: Path) -> tuple[np.ndarray, np.ndarray, tuple[float, ...] | None]:
        arrays = read_npz(path)
        problems = sample_problems(arrays, self.manifest)
        if problems:
            raise DataError(f"{path}: {'; '.join(problems)}")
        spacing = tuple(float(s) for s in arrays["spacing"]) if "spacing" in arrays else None
        return arrays["image"], arrays["mask"], spacing

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
        m = self.manifest
        out = np.empty((len(ids), *m.spatial_shape), np.uint8)
        for i, sid in enumerate(ids):
            path = weak_path(self.root, info.name, split, sid)
            if not path.is_file():
                raise DataError(f"{path}: weak label missing; {WEAK_HINT}")
            weak = read_npy(path)
            problems = label_problems(
                weak, out.shape[1:], m.num_classes, "weak label", m.ignore_index
            )
            if problems:
                raise DataError(f"{path}: {problems[0]}")
            out[i] = weak
        return out


def _merge_spacing(
    spacing: list[tuple[float, ...] | None], ids: list[str], folder: Path
) -> list[tuple[float, ...]] | None:
    known = [s for s in spacing if s is not None]
    if not known:
        return None
    if len(known) != len(spacing):
        lacking = [i for i, s in zip(ids, spacing, strict=True) if s is None]
        raise DataError(
            f"{folder}: {len(known)} of {len(ids)} samples carry 'spacing', {lacking[:5]} do "
            "not; give every sample spacing or none"
        )
    return known
