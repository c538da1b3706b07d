"""Weak labels for one mask (``weak_label``) and for a whole federation folder
(``generate_weak_labels``, the ``fedseg data weak-labels`` command)."""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from fedseg.data.federation import (
    FederatedDataset,
    label_problems,
    read_npz,
    sample_dir,
    sample_ids,
    weak_path,
)
from fedseg.data.manifest import (
    BOX_CONVERSIONS,
    MANIFEST,
    SPLITS,
    Annotation,
    BoxConversion,
    Manifest,
    WeakLabelRecord,
    check_annotations,
    sparsity_of,
    validate_manifest,
    write_manifest,
)
from fedseg.data.weak.boxes import box_label
from fedseg.data.weak.params import WeakLabelParams
from fedseg.data.weak.sparse import block_label, point_label, scribble2_label, scribble_label
from fedseg.errors import DataError

__all__ = ["generate_weak_labels", "sample_rng", "weak_label"]

Labeler = Callable[[np.ndarray, np.random.Generator, WeakLabelParams], np.ndarray]

_PIXEL_LABELERS: dict[str, Labeler] = {
    "point": point_label,
    "scribble": scribble_label,
    "scribble2": scribble2_label,
    "block": block_label,
}


def _labeler(annotation: str, box_conversion: str) -> Labeler:
    if annotation in _PIXEL_LABELERS:
        return _PIXEL_LABELERS[annotation]
    if annotation in ("box", "rotated_box"):
        if box_conversion not in BOX_CONVERSIONS:
            raise DataError(
                f"box conversion must be one of {list(BOX_CONVERSIONS)}, got {box_conversion!r}"
            )
        return partial(box_label, rotated=annotation == "rotated_box", conversion=box_conversion)
    weak_types = [*_PIXEL_LABELERS, "box", "rotated_box"]
    raise DataError(
        f"annotation must be one of {weak_types} to make weak labels, got {annotation!r}"
    )


def weak_label(
    mask: np.ndarray,
    annotation: Annotation,
    rng: np.random.Generator,
    *,
    box_conversion: BoxConversion = "block",
    params: WeakLabelParams | None = None,
) -> np.ndarray:
    """Synthesize a weak label (uint8, ``IGNORE_INDEX`` = unlabeled) from a full ``mask``.

    2D masks (H, W) are labeled directly; 3D masks (D, H, W) slice by slice along D.
    """
    labeler = _labeler(annotation, box_conversion)
    p = params or WeakLabelParams()
    if mask.ndim == 2:
        return labeler(mask, rng, p)
    if mask.ndim == 3:
        return np.stack([labeler(s, rng, p) for s in mask])
    raise DataError(f"weak labels need a 2D or 3D mask, got shape {mask.shape}")


def sample_rng(seed: int, site: str, split: str, sample_id: str) -> np.random.Generator:
    """Generator for one sample, independent of the order in which samples are processed."""
    keys = [zlib.crc32(k.encode()) for k in (site, split, sample_id)]
    return np.random.default_rng([seed, *keys])


def _read_mask(path: Path, m: Manifest) -> np.ndarray:
    """The checked full mask of the sample ``path``; DataError naming the file otherwise."""
    mask = read_npz(path)["mask"]
    problems = label_problems(mask, tuple(m.spatial_shape), m.num_classes)
    if problems:
        raise DataError(f"{path}: {'; '.join(problems)}")
    return mask


def generate_weak_labels(
    root: str | Path,
    *,
    seed: int = 0,
    annotations: Mapping[str, Annotation] | None = None,
    box_conversion: BoxConversion | None = None,
    params: WeakLabelParams | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """(Re)generate the weak labels of every split of every weakly annotated site.

    Images are never rewritten: labels go to ``sites/<site>/<split>/weak/<id>.npy`` and old
    weak files are removed first. ``annotations`` overrides the annotation type of some sites
    and ``box_conversion`` the manifest's; the manifest is updated (annotation, sparsity and a
    ``weak_labels`` record with the seed). ``progress(done, total)`` is called per sample.
    """
    fed = FederatedDataset.open(root)
    m = fed.manifest
    overrides = check_annotations(annotations or {})
    unknown = sorted(set(overrides) - set(m.site_names))
    if unknown:
        raise DataError(f"--annotation names unknown sites {unknown}; sites are {m.site_names}")
    conversion = box_conversion or m.box_conversion
    chosen = {s.name: overrides.get(s.name, s.annotation) for s in m.sites}
    for ann in (set(chosen.values()) - {"full"}) | {"box"}:
        _labeler(ann, conversion)  # bad types or conversions fail before any file is touched
    work = [
        (site, split, sid)
        for site, ann in chosen.items()
        if ann != "full"
        for split in SPLITS
        for sid in sample_ids(fed.root, site, split)
    ]
    for site, split, sid in work:  # a damaged mask fails before any old label is removed
        _read_mask(sample_dir(fed.root, site, split) / f"{sid}.npz", m)
    for site in m.site_names:
        for split in SPLITS:
            shutil.rmtree(sample_dir(fed.root, site, split) / "weak", ignore_errors=True)
    p = params or WeakLabelParams()
    for done, (site, split, sid) in enumerate(work, start=1):
        mask = _read_mask(sample_dir(fed.root, site, split) / f"{sid}.npz", m)
        weak = weak_label(
            mask,
            chosen[site],
            sample_rng(seed, site, split, sid),
            box_conversion=conversion,
            params=p,
        )
        path = weak_path(fed.root, site, split, sid)
        path.parent.mkdir(exist_ok=True)
        np.save(path, weak)
        if progress is not None:
            progress(done, len(work))
    record = WeakLabelRecord(origin="synthesized", seed=seed, annotations=chosen)
    raw = m.model_dump()
    for site in raw["sites"]:
        site["annotation"] = chosen[site["name"]]
        site["sparsity"] = sparsity_of(chosen[site["name"]], conversion)
    raw.update(box_conversion=conversion, weak_labels=record.model_dump())
    updated = validate_manifest(raw, str(fed.root / MANIFEST))
    write_manifest(fed.root, updated)
    return updated
