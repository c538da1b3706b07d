"""Shared importer pieces: site folders, image/mask pairing, splits, grey-level mappings."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fedseg.data.manifest import Annotation, check_annotations
from fedseg.errors import DataError

__all__ = [
    "ANY_LEVEL",
    "apply_window",
    "assign_splits",
    "check_window",
    "find_pairs",
    "map_levels",
    "natural_key",
    "parse_assignments",
    "parse_levels",
    "site_annotations",
    "site_dirs",
    "stem",
]


def natural_key(name: str) -> list[int | str]:
    """Sort key putting ``Domain2`` before ``Domain10``."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def site_dirs(src: Path) -> list[Path]:
    """The site folders (sub-folders) of ``src`` in natural order."""
    if not src.is_dir():
        raise DataError(f"{src} is not a folder")
    sites = sorted((p for p in src.iterdir() if p.is_dir()), key=lambda p: natural_key(p.name))
    if not sites:
        raise DataError(f"{src} holds no site folders (one sub-folder per site expected)")
    return sites


def stem(path: Path) -> str:
    """File name without its extension (both parts of ``.nii.gz``)."""
    return path.name[: -len(".nii.gz")] if path.name.lower().endswith(".nii.gz") else path.stem


def find_pairs(
    folder: Path,
    *,
    images_dir: str,
    masks_dir: str,
    extensions: Sequence[str],
    mask_suffix: str = "",
    mask_prefix: str = "",
    mask_extensions: Sequence[str] | None = None,
) -> list[tuple[str, Path, Path]]:
    """Pair images with masks in ``folder``: ``<images_dir>/<id>.*`` with
    ``<masks_dir>/<mask_prefix><id><mask_suffix>.*``, or, when those folders do not exist and
    a ``mask_suffix`` is given, ``<id>.*`` with ``<id><mask_suffix>.*`` side by side. Prefix
    and suffix match whatever their case (``_Segmentation`` finds ``_segmentation``); masks
    have ``mask_extensions`` (default: ``extensions``).

    Raises:
        DataError: a missing sub-folder, no images, or an image without its mask or a mask
            without its image (naming the near matches, e.g. a mask with another suffix).
    """
    img_dir, mask_dir = folder / images_dir, folder / masks_dir
    if not img_dir.is_dir():
        if not mask_suffix:
            raise DataError(f"{folder}: expected sub-folders {images_dir}/ and {masks_dir}/")
        img_dir = mask_dir = folder
    if not mask_dir.is_dir():
        raise DataError(f"{folder}: has {images_dir}/ but no {masks_dir}/; expected both")
    files = [p for p in img_dir.iterdir() if _has_ext(p, extensions)]
    mask_extensions = extensions if mask_extensions is None else mask_extensions
    mask_files = [p for p in mask_dir.iterdir() if _has_ext(p, mask_extensions)]
    side_by_side = img_dir == mask_dir
    if side_by_side:
        mask_files = [p for p in mask_files if _mask_id(stem(p), mask_prefix, mask_suffix, True)]
        files = [p for p in files if p not in mask_files]
    images = _by_stem(files)
    if not images:
        raise DataError(f"{img_dir}: no image files with extensions {list(extensions)}")
    masks: dict[str, Path] = {}
    strays = []  # mask files lacking the prefix
    for k, p in _by_stem(mask_files).items():
        key = _mask_id(k, mask_prefix, mask_suffix, side_by_side)
        if key is None:
            strays.append(k)
        elif masks.setdefault(key, p) != p:
            raise DataError(f"{masks[key]} and {p} are both the mask of {key!r}; keep one")
    lonely = sorted(set(images) - set(masks), key=natural_key)
    orphans = sorted([*(set(masks) - set(images)), *strays], key=natural_key)
    if lonely or orphans:
        paired = {images[k] for k in set(images) & set(masks)} | {
            masks[k] for k in set(images) & set(masks)
        }
        others = sorted(
            stem(p) for p in mask_dir.iterdir() if _has_ext(p, mask_extensions) and p not in paired
        )
        near = {k: _near(k, f"{mask_prefix}{k}{mask_suffix}", others) for k in lonely[:5]}
        hints = [f"{k} ~ {m}" for k, m in near.items() if m]
        raise DataError(
            f"{folder}: every image needs exactly one mask {mask_prefix}<id>{mask_suffix}.* in "
            f"{mask_dir}; images without mask: {lonely[:5] or 'none'}, masks without image: "
            f"{orphans[:5] or 'none'}" + (f"; near matches: {', '.join(hints)}" if hints else "")
        )
    return [(k, images[k], masks[k]) for k in sorted(images, key=natural_key)]


def _near(image_id: str, wanted: str, names: list[str]) -> str | None:
    """The file stem in ``names`` most like the mask ``wanted`` of ``image_id``: one that
    starts with the id (another suffix), else the closest by difflib, case ignored."""
    low = {n.lower(): n for n in names if n != image_id}
    starts = [n for key, n in low.items() if key.startswith(image_id.lower())]
    close = difflib.get_close_matches(wanted.lower(), list(low), n=1)
    return starts[0] if starts else (low[close[0]] if close else None)


def _mask_id(name: str, prefix: str, suffix: str, need_suffix: bool) -> str | None:
    """The image id of mask file stem ``name``: without ``prefix`` (required) and ``suffix``
    (optional unless ``need_suffix``), both matched whatever their case; None if it lacks them."""
    low = name.lower()
    has_suffix = bool(suffix) and low.endswith(suffix.lower())
    if not low.startswith(prefix.lower()) or (need_suffix and not has_suffix):
        return None
    core = name[len(prefix) : len(name) - len(suffix) if has_suffix else len(name)]
    return core or None


def assign_splits(
    ids: Sequence[str],
    *,
    test_fraction: float,
    val_fraction: float,
    seed: int,
    given: dict[str, str] | None = None,
) -> dict[str, str]:
    """Map every id to ``train``/``val``/``test``.

    ``given`` (id -> ``train``/``test``, from a pre-split layout) is kept; otherwise
    ``test_fraction`` of the ids are drawn as test. Then ``val_fraction`` of the training ids
    are drawn as val. Draws are seeded and independent of file order.
    """
    for name, value in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0 <= value < 1:
            raise DataError(f"{name} must be in [0, 1), got {value}")
    rng = np.random.default_rng(seed)
    ordered = sorted(ids, key=natural_key)
    splits = dict(given) if given is not None else _draw(ordered, test_fraction, rng, "test")
    train = [i for i in ordered if splits[i] == "train"]
    splits.update(_draw(train, val_fraction, rng, "val"))
    return splits


def _draw(ids: list[str], fraction: float, rng: np.random.Generator, name: str) -> dict[str, str]:
    k = round(len(ids) * fraction)
    if fraction > 0 and len(ids) > 1:
        k = min(max(k, 1), len(ids) - 1)
    chosen = set(rng.permutation(len(ids))[:k].tolist())
    return {i: (name if j in chosen else "train") for j, i in enumerate(ids)}


def parse_assignments(items: Iterable[str], what: str) -> dict[str, str]:
    """``["A=scribble", "B=point"]`` -> ``{"A": "scribble", "B": "point"}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise DataError(f"{what} entries must look like SITE=VALUE, got {item!r}")
        out[key] = value
    return out


ANY_LEVEL = -1
"""Key of the mapping entry ``*=CLASS``: every value not near a listed level (instance ids)."""


def parse_levels(text: str) -> dict[int, int]:
    """``"0=0,128=1,255=2"`` -> grey level to class mapping; ``*=1`` maps every other value
    (key ``ANY_LEVEL``), e.g. ``0=0,*=1`` for instance-labelled nuclei masks."""
    mapping = {}
    for item in text.split(","):
        level, sep, cls = (part.strip() for part in item.partition("="))
        if not sep or not (level.isdigit() or level == "*") or not cls.isdigit():
            raise DataError(
                f"mapping entries must look like LEVEL=CLASS or *=CLASS, got {item!r} in {text!r}"
            )
        mapping[ANY_LEVEL if level == "*" else int(level)] = int(cls)
    return mapping


def map_levels(mask: np.ndarray, mapping: dict[int, int], tolerance: int, where: str) -> np.ndarray:
    """Map mask values to classes: each value goes to the nearest mapped level within
    ``tolerance`` (JPEG masks drift a little); any other value goes to ``mapping[ANY_LEVEL]``
    when given, else is an error, never dropped."""
    levels = np.asarray(sorted(k for k in mapping if k != ANY_LEVEL))
    values = np.unique(mask)
    if not len(levels):
        return np.full(mask.shape, mapping[ANY_LEVEL], np.uint8)
    nearest = levels[np.abs(values[:, None].astype(np.int64) - levels[None]).argmin(axis=1)]
    far = np.abs(values.astype(np.int64) - nearest) > tolerance
    if far.any() and ANY_LEVEL not in mapping:
        raise DataError(
            f"{where}: values {values[far][:10].tolist()} are not within {tolerance} of the "
            f"mapped levels {levels.tolist()}; add them to the mapping (or raise the tolerance, "
            "or map all others with *=CLASS)"
        )
    out = np.zeros(mask.shape, np.uint8)
    for value, level, other in zip(values, nearest, far, strict=True):
        out[mask == value] = mapping[ANY_LEVEL] if other else mapping[int(level)]
    return out


def check_window(window: tuple[float, float] | None, where: str) -> None:
    """DataError unless ``window`` is None or a finite ``(LOW, HIGH)`` with LOW < HIGH."""
    if window is not None and not (
        len(window) == 2 and all(np.isfinite(window)) and window[0] < window[1]
    ):
        raise DataError(f"{where} must be LOW,HIGH with LOW < HIGH (in HU), got {window}")


def apply_window(data: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """CT intensities clipped to ``window`` (HU) and scaled to [0, 1], as float32."""
    low, high = window
    return ((np.clip(data, low, high) - low) / (high - low)).astype(np.float32)


def site_annotations(
    given: Mapping[str, str] | None, sites: Sequence[str], src: Path
) -> dict[str, Annotation]:
    """Annotation type of every site: ``given[site]`` or ``full``; unknown sites/types raise."""
    chosen = check_annotations(given or {})
    unknown = sorted(set(chosen) - set(sites))
    if unknown:
        raise DataError(f"--annotation names unknown sites {unknown}; {src} has {list(sites)}")
    return {s: chosen.get(s, "full") for s in sites}


def _by_stem(paths: list[Path]) -> dict[str, Path]:
    """``{stem: path}``; DataError naming two files with one stem (``a.png`` and ``a.jpg``)."""
    out: dict[str, Path] = {}
    for p in sorted(paths):
        twin = out.setdefault(stem(p), p)
        if twin != p:
            raise DataError(f"{twin} and {p} would give one sample id {stem(p)!r}; keep one")
    return out


def _has_ext(path: Path, extensions: Sequence[str]) -> bool:
    return path.is_file() and any(path.name.lower().endswith(e) for e in extensions)
