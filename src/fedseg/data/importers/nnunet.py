"""Import nnU-Net v2 raw datasets and Medical Segmentation Decathlon (MSD) tasks.

nnU-Net v2: ``DatasetXXX_Name/dataset.json`` (``channel_names``, ``labels`` name -> value,
``file_ending``), ``imagesTr/<case>_0000<ending>`` (one file per channel, ``_0001``, ...) and
``labelsTr/<case><ending>``. MSD: ``TaskXX_Name/dataset.json`` (``modality``, ``labels`` value
-> name, ``training: [{image, label}]``) with 4D multi-channel images. Test images of both
layouts carry no labels and are not imported; the test split is drawn from the training cases.
Each dataset folder is one site, unless a CSV (``case,site``) or a regex on the case id assigns
sites. Volumes are handled like :func:`fedseg.data.importers.nifti.import_nifti`.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import nibabel as nib
import numpy as np

from fedseg.data.arrays import normalize_intensity
from fedseg.data.importers.common import (
    apply_window,
    assign_splits,
    check_window,
    natural_key,
    site_annotations,
)
from fedseg.data.importers.nifti import (
    NiftiImport,
    check_volume_options,
    load_volume,
    resample_case,
)
from fedseg.data.importers.samples import each_case, write_case
from fedseg.data.manifest import Annotation
from fedseg.data.resample import Interpolation
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

__all__ = ["NORMALIZATIONS", "import_nnunet"]

Normalization = Literal["zscore", "minmax", "none"]
NORMALIZATIONS: tuple[str, ...] = ("zscore", "minmax", "none")


@dataclass(frozen=True)
class _Dataset:
    """One parsed dataset folder: channel names, class names and its cases."""

    name: str
    channels: list[str]
    classes: list[str]
    cases: dict[str, tuple[list[Path], Path]]  # case -> (channel files or one 4D file, label)


def import_nnunet(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    mode: Literal["2d", "3d"],
    shape: Sequence[int],
    axis: int = 2,
    fit: Literal["resize", "crop"] | None = None,
    drop_empty: bool = True,
    normalization: Normalization = "minmax",
    ct_window: tuple[float, float] | None = None,
    spacing: Sequence[float] | None = None,
    interpolation: Interpolation = "linear",
    site_csv: str | Path | None = None,
    site_regex: str | None = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    task: str = "imported",
    annotations: Mapping[str, Annotation] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> NiftiImport:
    """Convert nnU-Net v2 / MSD dataset folders ``sources`` into a federation folder ``out``.

    All datasets must share channel and class names. Sites: one per dataset folder (its name
    without the ``DatasetXXX_`` / ``TaskXX_`` prefix), or from ``site_csv`` (columns ``case``,
    ``site``) or ``site_regex`` (its ``site`` group, else group 1, searched in the case id).
    Channels named ``CT`` are clipped to ``ct_window`` and scaled to [0, 1] when it is given;
    every other channel is normalised per case: ``minmax`` (to [0, 1], clipped at the 99.5th
    percentile, as import-nifti), ``zscore`` (mean 0, std 1) or ``none``. ``mode``, ``shape``,
    ``axis``, ``fit``, ``drop_empty``, ``spacing`` and ``interpolation`` (resampling to one
    voxel spacing, before normalising) are those of ``import_nifti``.
    """
    _, fit = check_volume_options(mode, shape, axis, fit, spacing, interpolation)
    if normalization not in NORMALIZATIONS:
        raise DataError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if site_csv is not None and site_regex is not None:
        raise DataError("give a site CSV or a site regex, not both")
    if not sources:
        raise DataError("no dataset folders given")
    datasets = [_parse(Path(s)) for s in sources]
    first = datasets[0]
    for d in datasets[1:]:
        if (d.channels, d.classes) != (first.channels, first.classes):
            raise DataError(
                f"{d.name}: channels {d.channels} and labels {d.classes} differ from "
                f"{first.name}'s {first.channels} and {first.classes}; datasets must agree"
            )
    is_ct = [c.strip().lower() == "ct" for c in first.channels]
    check_window(ct_window, "ct_window")
    if ct_window is not None and not any(is_ct):
        raise DataError(
            f"ct_window {ct_window} needs a channel named CT in {first.name}'s dataset.json "
            f"(channels: {first.channels})"
        )
    sites = _assign_sites(datasets, site_csv, site_regex)
    plan = {}
    for site in sorted(sites, key=natural_key):
        items = sites[site]
        splits = assign_splits(
            list(items), test_fraction=test_fraction, val_fraction=val_fraction, seed=seed
        )
        plan[site] = [(case, *items[case], splits[case]) for case in items]
    chosen = site_annotations(annotations, list(plan), Path(sources[0]))
    modality = "CT" if all(is_ct) else "+".join(first.channels)
    with FederationWriter(
        Path(out),
        task=task,
        class_names=first.classes,
        modality=modality,
        channels=len(first.channels),
        spatial_shape=tuple(shape),
        source=f"imported from nnU-Net/MSD datasets {[str(s) for s in sources]}",
        overwrite=overwrite,
    ) as writer:
        dropped = 0
        for site, (case, files, lab_path, split) in each_case(plan, progress):
            image, label, zooms = _read_case(
                files, lab_path, axis, len(first.channels), len(first.classes)
            )
            image, label, zooms = resample_case(image, label, zooms, spacing, interpolation)
            for c, data in enumerate(image):
                window = ct_window if is_ct[c] else None
                image[c] = _normalise(data, normalization, window)
            dropped += write_case(
                writer,
                site,
                split,
                case,
                image,
                label,
                zooms,
                shape=shape,
                fit=fit,
                drop_empty=drop_empty,
                origin=str(files[0]),
            )
        return NiftiImport(writer.finish(chosen), dropped)


def _parse(folder: Path) -> _Dataset:
    """Read ``folder/dataset.json`` (nnU-Net v2 or MSD) and find its training cases."""
    path = folder / "dataset.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing (nnU-Net/MSD datasets have a dataset.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: must hold a JSON object")
    name = re.sub(r"^(Dataset\d{3}|Task\d{2,3})_", "", folder.resolve().name)
    if "channel_names" in meta:
        return _parse_nnunet(folder, path, meta, name)
    if "modality" in meta:
        return _parse_msd(folder, path, meta, name)
    raise DataError(f"{path}: needs 'channel_names' (nnU-Net v2) or 'modality' (MSD)")


def _parse_nnunet(folder: Path, path: Path, meta: dict[str, Any], name: str) -> _Dataset:
    channels = _indexed(meta["channel_names"], path, "channel_names")
    labels = meta.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise DataError(f"{path}: 'labels' must map label names to integer values")
    regions = [k for k, v in labels.items() if isinstance(v, list | tuple)]
    if regions:
        raise DataError(
            f"{path}: 'labels' {regions} are region-based (lists of values); fedseg needs one "
            "value per class -- convert them to plain labels first"
        )
    by_value = {}
    for label_name, value in labels.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise DataError(
                f"{path}: 'labels' value of {label_name!r} must be an int, got {value!r}"
            )
        if by_value.setdefault(value, label_name) != label_name:
            raise DataError(
                f"{path}: 'labels' {by_value[value]!r} and {label_name!r} share {value}"
            )
    classes = _indexed({str(k): v for k, v in by_value.items()}, path, "labels")
    ending = meta.get("file_ending", ".nii.gz")
    if ending not in (".nii.gz", ".nii"):
        raise DataError(f"{path}: 'file_ending' {ending!r} is not supported (.nii.gz or .nii)")
    img_dir, lab_dir = folder / "imagesTr", folder / "labelsTr"
    suffix = f"_0000{ending}"
    firsts = sorted(img_dir.glob(f"*{suffix}")) if img_dir.is_dir() else []
    if not firsts:
        raise DataError(f"{img_dir}: no '<case>{suffix}' files (nnU-Net channel 0)")
    cases = {}
    for p in firsts:
        case = p.name[: -len(suffix)]
        files = [img_dir / f"{case}_{c:04d}{ending}" for c in range(len(channels))]
        for f in [*files, lab_dir / f"{case}{ending}"]:
            if not f.is_file():
                raise DataError(f"{f}: missing (case {case!r}, {len(channels)} channels in {path})")
        cases[case] = (files, lab_dir / f"{case}{ending}")
    return _Dataset(name, channels, classes, cases)


def _parse_msd(folder: Path, path: Path, meta: dict[str, Any], name: str) -> _Dataset:
    channels = _indexed(meta["modality"], path, "modality")
    classes = _indexed(meta.get("labels"), path, "labels")
    training = meta.get("training")
    if not isinstance(training, list) or not training:
        raise DataError(f"{path}: 'training' must be a non-empty list of {{image, label}}")
    cases = {}
    for k, entry in enumerate(training):
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(key), str) for key in ("image", "label")
        ):
            raise DataError(f"{path}: 'training'[{k}] must have 'image' and 'label' paths")
        image, label = folder / entry["image"], folder / entry["label"]
        for f in (image, label):
            if not f.is_file():
                raise DataError(f"{f}: missing (listed in {path} 'training'[{k}])")
        case = image.name.removesuffix(".gz").removesuffix(".nii")
        cases[case] = ([image], label)
    return _Dataset(name, channels, classes, cases)


def _indexed(value: object, path: Path, field: str) -> list[str]:
    """``{"0": "a", "1": "b"}`` -> ``["a", "b"]``; keys must be 0..n-1."""
    if not isinstance(value, dict) or not value:
        raise DataError(f"{path}: '{field}' must be an object {{\"0\": name, ...}}")
    try:
        by_key = {int(k): str(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise DataError(f"{path}: '{field}' keys must be integers, got {list(value)}") from None
    keys = sorted(by_key)
    if keys != list(range(len(value))):
        raise DataError(f"{path}: '{field}' values must be 0..{len(value) - 1}, got {keys}")
    return [by_key[k] for k in keys]


def _assign_sites(
    datasets: list[_Dataset], site_csv: str | Path | None, site_regex: str | None
) -> dict[str, dict[str, tuple[list[Path], Path]]]:
    """site -> case -> files; one site per dataset unless a CSV or regex assigns them."""
    if site_csv is None and site_regex is None:
        names = [d.name for d in datasets]
        if len(set(names)) < len(names):
            raise DataError(f"dataset folders give duplicate site names {names}")
        return {d.name: d.cases for d in datasets}
    pooled: dict[str, tuple[list[Path], Path]] = {}
    for d in datasets:
        twins = sorted(set(pooled) & set(d.cases))
        if twins:
            raise DataError(f"case ids {twins[:5]} occur in more than one dataset")
        pooled.update(d.cases)
    site_of = _csv_sites(Path(site_csv)) if site_csv is not None else None
    pattern = _regex(site_regex) if site_regex is not None else None
    sites: dict[str, dict[str, tuple[list[Path], Path]]] = {}
    for case in sorted(pooled, key=natural_key):
        if site_of is not None:
            site = site_of.get(case)
            where = f"site CSV {site_csv}"
        else:
            assert pattern is not None
            match = pattern.search(case)
            site = (
                (match.group("site") if "site" in pattern.groupindex else match.group(1))
                if match
                else None
            )
            where = f"site regex {site_regex!r}"
        if not site:
            raise DataError(f"case {case!r} has no site in the {where}")
        sites.setdefault(site, {})[case] = pooled[case]
    return sites


def _csv_sites(path: Path) -> dict[str, str]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise DataError(f"{path}: cannot read the site CSV ({e.strerror})") from None
    if not rows or not {"case", "site"} <= set(rows[0]):
        raise DataError(f"{path}: the site CSV needs a header with columns 'case' and 'site'")
    return {r["case"].strip(): (r["site"] or "").strip() for r in rows}


def _regex(text: str) -> re.Pattern[str]:
    try:
        pattern = re.compile(text)
    except re.error as e:
        raise DataError(f"site regex {text!r} is invalid: {e}") from None
    if pattern.groups < 1:
        raise DataError(f"site regex {text!r} needs a group (named 'site' or the first one)")
    return pattern


def _read_case(
    files: list[Path], lab_path: Path, axis: int, channels: int, k: int
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Channels (C, D, H, W), label (D, H, W) with ``axis`` first, RAS-oriented; spacing."""
    volumes = [load_volume(f, "image", channels=True) for f in files]
    first = volumes[0][1].shape[1:]
    for f, (_, channel) in zip(files, volumes, strict=True):
        if channel.shape[1:] != first:
            raise DataError(
                f"{f}: channel shape {channel.shape[1:]} differs from {files[0]} {first}"
            )
    data = np.concatenate([v[1] for v in volumes])
    if len(data) != channels:
        raise DataError(
            f"{files[0]}: {len(data)} channels, dataset.json lists {channels} channel names"
        )
    _, raw = load_volume(lab_path, "label")
    if raw.shape != data.shape[1:]:
        raise DataError(
            f"{lab_path}: label shape {raw.shape} differs from its image {data.shape[1:]} "
            f"({files[0]})"
        )
    label = np.rint(raw).astype(np.int64)
    bad = sorted(set(np.unique(label).tolist()) - set(range(k)))
    if not np.array_equal(label, raw) or bad:
        raise DataError(
            f"{lab_path}: label values must be the integers 0..{k - 1} listed in dataset.json "
            f"'labels', got {bad[:10] or 'non-integers'}"
        )
    zooms = [float(z) for z in nib.affines.voxel_sizes(volumes[0][0].affine)]
    order = [axis] + [a for a in range(3) if a != axis]
    image = np.transpose(data, [0] + [a + 1 for a in order]).astype(np.float32)
    return image, np.transpose(label, order).astype(np.uint8), tuple(zooms[a] for a in order)


def _normalise(
    data: np.ndarray, how: Normalization, window: tuple[float, float] | None
) -> np.ndarray:
    """One channel of one case: CT window (clip, scale to [0, 1]) or ``how``."""
    if window is not None:
        return apply_window(data, window)
    if how == "minmax":
        return normalize_intensity(data)
    if how == "zscore":
        return (data - data.mean()) / max(float(data.std()), 1e-6)
    return data
