"""Validation of a federation folder: ``check_federation`` lists problems, ``require_valid``
refuses to start a run on a broken folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedseg.data.federation import WEAK_HINT, FederatedDataset, sample_dir, sample_ids, weak_path
from fedseg.data.manifest import MANIFEST, SPLITS, Manifest, SiteInfo
from fedseg.errors import DataError

__all__ = ["Problem", "check_federation", "require_valid"]


@dataclass(frozen=True)
class Problem:
    """One problem found in a federation folder."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def check_federation(
    fed: FederatedDataset,
    batch_size: int | None = None,
    labels: Literal["full", "weak"] = "full",
) -> list[Problem]:
    """Every problem of ``fed``: missing or extra files, shapes, label values, non-finite pixels,
    empty sites, train splits smaller than ``batch_size`` and, when ``labels`` is ``weak``,
    weak labels that were never generated or are stale."""
    problems: list[Problem] = []
    for site in fed.manifest.sites:
        problems += _check_site_sizes(fed.root, site, batch_size)
        if labels == "weak":
            problems += _check_weak_record(fed, site)
        for split in SPLITS:
            problems += _check_split(fed.root, fed.manifest, site, split)
    return problems


def require_valid(
    root: str | Path, batch_size: int | None = None, labels: Literal["full", "weak"] = "full"
) -> FederatedDataset:
    """Open ``root`` and raise DataError listing all problems unless it is valid."""
    fed = FederatedDataset.open(root)
    problems = fed.check(batch_size=batch_size, labels=labels)
    if problems:
        listing = "\n  ".join(str(p) for p in problems)
        raise DataError(
            f"{fed.root} has {len(problems)} problem(s); fix them or re-create the folder:\n"
            f"  {listing}"
        )
    return fed


def _check_site_sizes(root: Path, site: SiteInfo, batch_size: int | None) -> list[Problem]:
    where = root / MANIFEST
    if sum(site.splits.values()) == 0:
        return [Problem(where, f"site {site.name!r} has no samples in any split")]
    n_train = site.splits["train"]
    if n_train == 0:
        return [Problem(where, f"site {site.name!r} has an empty train split")]
    if batch_size is not None and n_train < batch_size:
        return [
            Problem(
                where,
                f"site {site.name!r} has {n_train} training samples, fewer than the batch "
                f"size {batch_size}",
            )
        ]
    return []


def _check_weak_record(fed: FederatedDataset, site: SiteInfo) -> list[Problem]:
    if site.annotation == "full":
        return []
    record = fed.manifest.weak_labels
    made_for = record.annotations.get(site.name) if record else None
    where = fed.root / MANIFEST
    if made_for is None:
        return [Problem(where, f"site {site.name!r} has no weak labels; {WEAK_HINT}")]
    if made_for != site.annotation:
        return [
            Problem(
                where,
                f"site {site.name!r} weak labels were made for {made_for!r}, the annotation is "
                f"{site.annotation!r}; {WEAK_HINT}",
            )
        ]
    problems = []
    for split in ("train", "val"):
        missing = [
            i
            for i in sample_ids(fed.root, site.name, split)
            if not weak_path(fed.root, site.name, split, i).is_file()
        ]
        if missing:
            folder = sample_dir(fed.root, site.name, split) / "weak"
            problems.append(
                Problem(folder, f"weak labels missing for {_ids(missing)}; {WEAK_HINT}")
            )
    return problems


def _check_split(root: Path, m: Manifest, site: SiteInfo, split: str) -> list[Problem]:
    folder = sample_dir(root, site.name, split)
    ids = sample_ids(root, site.name, split)
    expected = site.splits[split]
    problems: list[Problem] = []
    if expected and not folder.is_dir():
        return [Problem(folder, f"folder missing; the manifest lists {expected} samples")]
    if len(ids) != expected:
        problems.append(
            Problem(folder, f"manifest says {expected} samples, found {len(ids)} .npz files")
        )
    for sid in ids:
        problems += _check_sample(folder / f"{sid}.npz", m)
    weak_dir = folder / "weak"
    if weak_dir.is_dir():
        weak_ids = {p.stem for p in weak_dir.glob("*.npy")}
        orphans = sorted(weak_ids - set(ids))
        if orphans:
            problems.append(Problem(weak_dir, f"weak labels without a sample: {_ids(orphans)}"))
        for sid in sorted(weak_ids & set(ids)):
            problems += _check_weak_file(weak_path(root, site.name, split, sid), m)
    return problems


def _check_sample(path: Path, m: Manifest) -> list[Problem]:
    try:
        with np.load(path) as z:
            keys = set(z.files)
            if not {"image", "mask"} <= keys:
                return [Problem(path, f"needs arrays 'image' and 'mask', has {sorted(keys)}")]
            image, mask = z["image"], z["mask"]
            spacing = z["spacing"] if "spacing" in keys else None
    except (OSError, ValueError) as e:
        return [Problem(path, f"cannot be read ({e})")]
    problems = []
    want = (m.channels, *m.spatial_shape)
    if image.shape != want:
        problems.append(Problem(path, f"image shape must be {want}, got {image.shape}"))
    if mask.shape != tuple(m.spatial_shape):
        problems.append(Problem(path, f"mask shape must be {m.spatial_shape}, got {mask.shape}"))
    if image.shape[1:] != mask.shape:
        problems.append(
            Problem(path, f"image {image.shape[1:]} and mask {mask.shape} shapes differ")
        )
    bad = sorted(set(np.unique(mask).tolist()) - set(range(m.num_classes)))
    if bad:
        problems.append(
            Problem(path, f"mask values must be in 0..{m.num_classes - 1}, got {bad[:10]}")
        )
    if not np.isfinite(image).all():
        count = int((~np.isfinite(image)).sum())
        problems.append(Problem(path, f"image holds {count} non-finite pixels"))
    if spacing is not None and (spacing.shape != (m.ndim,) or not (spacing > 0).all()):
        problems.append(
            Problem(path, f"spacing must be {m.ndim} positive values, got {spacing.tolist()}")
        )
    return problems


def _check_weak_file(path: Path, m: Manifest) -> list[Problem]:
    try:
        weak = np.load(path)
    except (OSError, ValueError) as e:
        return [Problem(path, f"cannot be read ({e})")]
    if weak.shape != tuple(m.spatial_shape):
        return [Problem(path, f"weak label shape must be {m.spatial_shape}, got {weak.shape}")]
    bad = sorted(set(np.unique(weak).tolist()) - {*range(m.num_classes), m.ignore_index})
    if bad:
        return [
            Problem(
                path,
                f"weak label values must be classes 0..{m.num_classes - 1} or "
                f"{m.ignore_index}, got {bad[:10]}",
            )
        ]
    return []


def _ids(ids: list[str], limit: int = 5) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
