"""Import the FedLPPA authors' layout: ``ROOT/DomainK/{train,test}/*.h5``.

Each file holds ``image`` ((H, W) or (C, H, W), float in [0, 1]) and ``mask`` (H, W); training
files also hold weak labels under ``scribble``, ``scribble_noisy``, ``block``, ``box`` and
``keypoint``, where the value ``num_classes`` marks unlabeled pixels (converted to 255).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np

from fedseg.data.federation import unreadable
from fedseg.data.importers.common import assign_splits, natural_key, site_dirs
from fedseg.data.manifest import (
    IGNORE_INDEX,
    Annotation,
    BoxConversion,
    Manifest,
    check_annotations,
)
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

__all__ = ["H5_WEAK_KEYS", "import_h5"]

H5_WEAK_KEYS: dict[str, str] = {
    "point": "keypoint",
    "scribble": "scribble",
    "scribble2": "scribble_noisy",
    "block": "block",
    "box": "box",
    "rotated_box": "box",
}
"""Annotation type -> h5 key (the authors store rotated boxes under ``box`` too)."""
_KEY_ANNOTATION: dict[str, Annotation] = {
    "keypoint": "point",
    "scribble": "scribble",
    "scribble_noisy": "scribble2",
    "block": "block",
    "box": "box",
}


def import_h5(
    src: str | Path,
    out: str | Path,
    *,
    class_names: Sequence[str],
    task: str = "imported",
    modality: str = "unspecified",
    annotations: Mapping[str, Annotation] | None = None,
    weak_keys: Mapping[str, str] | None = None,
    box_conversion: BoxConversion = "block",
    val_fraction: float = 0.0,
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Convert ``src`` (``DomainK/{train,test}/*.h5``) into a federation folder ``out``.

    A site's weak labels come from ``weak_keys[site]`` (an h5 key) or from the key of
    ``annotations[site]``; the annotation type is ``annotations[site]`` or the one the key
    implies. Sites with neither are fully annotated. ``val_fraction`` of each site's training
    files become its val split (seeded); the authors' ``test`` folder stays the test split.
    """
    src = Path(src)
    sites = site_dirs(src)
    names = [s.name for s in sites]
    annotations, weak_keys = check_annotations(annotations or {}), dict(weak_keys or {})
    for given, what in ((annotations, "--annotation"), (weak_keys, "--weak-key")):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise DataError(f"{what} names unknown sites {unknown}; {src} has {names}")
    bad_keys = sorted(set(weak_keys.values()) - set(_KEY_ANNOTATION))
    if bad_keys:
        raise DataError(f"--weak-key values must be in {sorted(_KEY_ANNOTATION)}, got {bad_keys}")
    keys = {n: weak_keys.get(n) or H5_WEAK_KEYS.get(annotations.get(n, "full")) for n in names}
    chosen: dict[str, Annotation] = {
        n: annotations.get(n) or (_KEY_ANNOTATION[keys[n]] if keys[n] else "full") for n in names
    }
    files = {s.name: _site_files(s) for s in sites}
    total = sum(len(f) for f in files.values())
    first = _read(files[names[0]][0], None, len(class_names))[0]
    with FederationWriter(
        Path(out),
        task=task,
        class_names=class_names,
        modality=modality,
        channels=first.shape[0],
        spatial_shape=first.shape[1:],
        box_conversion=box_conversion,
        source=f"imported from FedLPPA-style h5 files in {src}",
        overwrite=overwrite,
    ) as writer:
        done = 0
        for site in sites:
            site_files = files[site.name]
            given = {str(p.relative_to(site)): p.parent.name for p in site_files}
            splits = assign_splits(
                list(given), test_fraction=0, val_fraction=val_fraction, seed=seed, given=given
            )
            for p in site_files:
                split = splits[str(p.relative_to(site))]
                key = keys[site.name] if split != "test" else None
                image, mask, weak = _read(p, key, len(class_names))
                writer.add(site.name, split, p.stem, image, mask, weak=weak, origin=str(p))
                done += 1
                if progress is not None:
                    progress(done, total)
        weak_sites = any(keys.values())
        return writer.finish(chosen, weak_origin="imported:h5" if weak_sites else None)


def _site_files(site: Path) -> list[Path]:
    files = [
        p
        for split in ("train", "test")
        for p in sorted((site / split).glob("*.h5"), key=lambda q: natural_key(q.name))
        if p.is_file()
    ]
    if not (site / "train").is_dir():
        raise DataError(f"{site}: expected a train/ folder (and test/) of .h5 files")
    if not files:
        raise DataError(f"{site}: no .h5 files in train/ or test/")
    return files


def _read(
    path: Path, weak_key: str | None, num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    wanted = [k for k in ("image", "mask", weak_key) if k]
    try:
        with h5py.File(path, "r") as f:
            keys = sorted(f.keys())
            arrays = {k: np.asarray(f[k]) for k in wanted if k in keys}
    except Exception as e:  # every way a damaged file fails to parse is that file's problem
        raise DataError(unreadable(path, e, "an HDF5 file")) from None
    missing = [k for k in wanted if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing keys {missing}; it has {keys}")
    image, mask, weak = arrays["image"], arrays["mask"], arrays.get(weak_key or "")
    if image.dtype.kind != "f":
        raise DataError(
            f"{path}: image must be floating point with values in [0, 1] (the FedLPPA layout), "
            f"got dtype {image.dtype}"
        )
    if image.ndim == 2:
        image = image[None]
    if image.ndim != 3 or image.shape[0] not in (1, 3) or image.shape[1:] != mask.shape:
        raise DataError(
            f"{path}: image must be (H, W) or (C, H, W) with C in (1, 3) matching mask "
            f"{mask.shape}, got {image.shape}"
        )
    if weak is not None:
        unknown = sorted(set(np.unique(weak).tolist()) - set(range(num_classes + 1)))
        if unknown:
            raise DataError(
                f"{path}: {weak_key} values must be classes 0..{num_classes - 1} or the "
                f"unlabeled value {num_classes}, got {unknown[:10]}"
            )
        weak = np.where(weak == num_classes, IGNORE_INDEX, weak).astype(np.uint8)
    return image, mask, weak
