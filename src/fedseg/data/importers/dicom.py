"""Import DICOM image series with their masks (DICOM-SEG or RT Structure Set) per site.

Layout: ``SRC/<site>/**`` holding the files of image series and of SEG/RTSTRUCT objects under
any names and folders (a PACS export), or every file anywhere under ``SRC`` with the site taken
from a DICOM attribute of each series (``site_tag``, e.g. ``InstitutionName``). Series are
found by SeriesInstanceUID, slices ordered by ImagePositionPatient along the slice normal
(:mod:`~fedseg.data.importers.dicom_series`); a SEG or RTSTRUCT is the mask of the series it
references. Volumes are then handled as by :func:`~fedseg.data.importers.nifti.import_nifti`:
reoriented to RAS, optionally resampled to one spacing, scaled to [0, 1] (CT: by a window in
Hounsfield units), cut into slices along ``axis`` or kept as volumes.

Nothing identifying is written: samples hold pixel data and spacing only, sample ids and the
manifest's ``series`` record are SHA-256 hashes of the SeriesInstanceUIDs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedseg.data.arrays import normalize_intensity
from fedseg.data.importers.common import (
    apply_window,
    assign_splits,
    check_window,
    natural_key,
    site_annotations,
    site_dirs,
)
from fedseg.data.importers.dicom_rtstruct import read_rtstruct, roi_names
from fedseg.data.importers.dicom_seg import read_seg, referenced_series, segment_names
from fedseg.data.importers.dicom_series import (
    DicomObjects,
    Series,
    assemble,
    find_objects,
    series_hash,
    to_ras,
)
from fedseg.data.importers.nifti import NiftiImport, check_volume_options
from fedseg.data.importers.samples import each_case, write_case
from fedseg.data.manifest import Annotation
from fedseg.data.resample import resample_image, resample_mask
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

try:
    from pydicom.dataset import Dataset
except ImportError:  # the dicom extra
    raise DataError(
        "DICOM support needs pydicom and highdicom: pip install 'fedseg[dicom]'"
    ) from None

__all__ = ["DicomImport", "dicom_volume", "import_dicom", "read_series"]


@dataclass(frozen=True)
class DicomImport(NiftiImport):
    """What an import produced; ``unlabelled_series``: image series without a mask, skipped."""

    unlabelled_series: int = 0


@dataclass(frozen=True)
class _Case:
    series: Series
    path: Path
    mask: Dataset
    classes: dict[int, int]
    """Segment / ROI number -> class."""


def read_series(folder: Path) -> list[Series]:
    """Every image series under ``folder`` (any file names), in hash order."""
    objects = find_objects(folder.rglob("*"))
    return [assemble(uid, s) for uid, s in sorted(objects.images.items(), key=_by_hash)]


def dicom_volume(
    series: Series, axis: int, ct_window: tuple[float, float] | None
) -> tuple[np.ndarray, tuple[float, ...], np.ndarray]:
    """The series' volume as the importer prepares it: scaled to [0, 1] (``ct_window`` in HU,
    else min -> 0 and 99.5th percentile -> 1), RAS-oriented, ``axis`` first; its spacing in
    that order and the RAS orientation (:func:`~fedseg.data.importers.dicom_series.from_ras`)."""
    raw = series.pixels()
    image = normalize_intensity(raw) if ct_window is None else apply_window(raw, ct_window)
    ras, zooms, ornt = to_ras(image, series.affine)
    order = [axis] + [a for a in range(3) if a != axis]
    volume = np.ascontiguousarray(np.transpose(ras, order))
    return volume, tuple(float(zooms[a]) for a in order), ornt


def import_dicom(
    src: str | Path,
    out: str | Path,
    *,
    class_names: Sequence[str],
    mode: Literal["2d", "3d"] = "2d",
    shape: Sequence[int],
    axis: int = 2,
    fit: Literal["resize", "crop"] | None = None,
    drop_empty: bool = True,
    site_tag: str | None = None,
    segments: Mapping[str, str] | None = None,
    rois: Mapping[str, str] | None = None,
    ct_window: tuple[float, float] | None = None,
    spacing: Sequence[float] | None = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    task: str = "imported",
    annotations: Mapping[str, Annotation] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> DicomImport:
    """Convert the DICOM series and their SEG/RTSTRUCT masks in ``src`` into a federation.

    Segment labels (SEG) and ROI names (RTSTRUCT) become classes: a name equal to a class name
    (any case) is that class; ``segments`` / ``rois`` map other names to class names (or
    indices); mapping a name to the background (class 0) leaves it out. Any other name found
    is refused. Overlapping masks: the higher class wins. ``ct_window`` (LOW, HIGH in HU) scales
    CT series; ``spacing`` (mm; 2D H,W, 3D D,H,W after moving ``axis`` first) resamples every
    volume (images linear, masks nearest neighbour) and implies ``fit="crop"``. ``mode``,
    ``shape``, ``axis``, ``fit`` and ``drop_empty`` are those of ``import_nifti``. Image series
    without a mask are skipped and counted.
    """
    ndim, fit = check_volume_options(mode, shape, axis, fit, spacing)
    check_window(ct_window, "--ct-window")
    src = Path(src)
    by_name = _class_lookup(class_names, segments or {}, rois or {})
    plan, unlabelled = _plan(src, site_tag, by_name, list(class_names))
    modalities = sorted({c.series.modality for cases in plan.values() for c in cases})
    if ct_window is not None and modalities != ["CT"]:
        raise DataError(f"--ct-window scales CT series; {src} holds {modalities} series")
    splits = {
        site: assign_splits(
            [_case_id(c) for c in cases],
            test_fraction=test_fraction,
            val_fraction=val_fraction,
            seed=seed,
        )
        for site, cases in plan.items()
    }
    chosen = site_annotations(annotations, list(plan), src)
    with FederationWriter(
        Path(out),
        task=task,
        class_names=class_names,
        modality="+".join(modalities),
        channels=1,
        spatial_shape=tuple(shape),
        source=f"imported from DICOM series ({sum(map(len, plan.values()))} series, UIDs hashed)",
        overwrite=overwrite,
    ) as writer:
        dropped = 0
        for site, case in each_case(plan, progress):
            image, label, zooms = _read_case(case, axis, ct_window)
            if spacing is not None:  # slices keep their thickness, only H, W change in 2D
                target = (zooms[0], *spacing) if ndim == 2 else tuple(spacing)
                image = resample_image(image, zooms, target)
                label, zooms = resample_mask(label, zooms, target), target
            case_id = _case_id(case)
            dropped += write_case(
                writer,
                site,
                splits[site][case_id],
                case_id,
                image[None],
                label,
                zooms,
                shape=shape,
                fit=fit,
                drop_empty=drop_empty,
                origin=str(case.path),
            )
        record = {s: sorted(series_hash(c.series.uid) for c in v) for s, v in plan.items()}
        return DicomImport(writer.finish(chosen, series=record), dropped, unlabelled)


def _read_case(
    case: _Case, axis: int, ct_window: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Image and mask, RAS-oriented with ``axis`` first, and the spacing in that order."""
    if case.mask.Modality == "SEG":
        mask = read_seg(case.path, case.series, case.classes)
    else:
        mask = read_rtstruct(case.path, case.mask, case.series, case.classes)
    image, zooms, _ = dicom_volume(case.series, axis, ct_window)
    ras = to_ras(mask, case.series.affine)[0]
    order = [axis] + [a for a in range(3) if a != axis]
    return image, np.transpose(ras, order), zooms


def _case_id(case: _Case) -> str:
    return series_hash(case.series.uid)[:12]


def _by_hash(item: tuple[str, object]) -> str:
    return series_hash(item[0])


def _class_lookup(
    class_names: Sequence[str], segments: Mapping[str, str], rois: Mapping[str, str]
) -> dict[str, dict[str, int]]:
    """{'SEG': {name: class}, 'RTSTRUCT': {...}}: class names (lower case) plus the mappings."""
    index = {n.lower(): k for k, n in enumerate(class_names)}
    index.update({str(k): k for k in range(len(class_names))})
    out = {}
    for kind, given, option in (("SEG", segments, "--segment"), ("RTSTRUCT", rois, "--roi")):
        lookup = {n.lower(): k for k, n in enumerate(class_names) if k > 0}
        for name, cls in given.items():
            if cls.lower() not in index:
                raise DataError(
                    f"{option} {name}={cls}: {cls!r} is no class; classes: {list(class_names)}"
                )
            lookup[name.lower()] = index[cls.lower()]
        out[kind] = lookup
    return out


def _classes(
    path: Path, ds: Dataset, by_name: dict[str, dict[str, int]], class_names: list[str]
) -> dict[int, int]:
    """Segment/ROI number -> class of the mask object ``ds``; refuses unmapped names."""
    kind = str(ds.Modality)
    names = segment_names(ds) if kind == "SEG" else roi_names(ds)
    lookup = by_name[kind]
    unmapped = sorted({n for n in names.values() if n.lower() not in lookup})
    if unmapped:
        what, option = ("segment", "--segment") if kind == "SEG" else ("ROI", "--roi")
        raise DataError(
            f"{path}: {what} names {unmapped} map to no class; the file has "
            f"{sorted(set(names.values()))}; map each with {option} NAME=CLASS (classes: "
            f"{class_names}; CLASS {class_names[0]} leaves the {what} out)"
        )
    return {n: lookup[name.lower()] for n, name in names.items() if lookup[name.lower()] > 0}


def _plan(
    src: Path, site_tag: str | None, by_name: dict[str, dict[str, int]], class_names: list[str]
) -> tuple[dict[str, list[_Case]], int]:
    """Site -> its cases (series with their mask), and how many series had no mask."""
    if site_tag is None:
        groups = {d.name: find_objects(d.rglob("*")) for d in site_dirs(src)}
    else:
        groups = _by_tag(src, find_objects(src.rglob("*")), site_tag)
    plan, unlabelled = {}, 0
    for site, objects in groups.items():
        masks: dict[str, tuple[Path, Dataset]] = {}
        for path, ds in objects.annotations:
            uid = referenced_series(path, ds)
            classes = _classes(path, ds, by_name, class_names)
            if uid not in objects.images:
                raise DataError(
                    f"{path}: its referenced image series {uid} is absent from "
                    f"{src / site if site_tag is None else src}"
                )
            if uid in masks:
                raise DataError(
                    f"{path} and {masks[uid][0]} are both masks of one image series; keep one"
                )
            masks[uid] = (path, ds)
            plan.setdefault(site, []).append(
                _Case(assemble(uid, objects.images[uid]), path, ds, classes)
            )
        unlabelled += len(set(objects.images) - set(masks))
        if site in plan:
            plan[site].sort(key=lambda c: series_hash(c.series.uid))
    if not plan:
        raise DataError(f"{src}: no image series with a DICOM-SEG or RTSTRUCT mask found")
    return {s: plan[s] for s in sorted(plan, key=natural_key)}, unlabelled


def _by_tag(src: Path, objects: DicomObjects, tag: str) -> dict[str, DicomObjects]:
    """Split ``objects`` into sites by the attribute ``tag`` of each series' first slice;
    masks go with the series they reference."""
    sites: dict[str, DicomObjects] = {}
    site_of = {}
    for uid, slices in objects.images.items():
        path, ds = slices[0]
        value = str(ds.get(tag, "") or "").strip()
        if not value:
            raise DataError(f"{path}: no {tag} to take the site from (--site-tag)")
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", value).strip("_.-") or "site"
        site_of[uid] = name
        sites.setdefault(name, DicomObjects({}, [])).images[uid] = slices
    for path, ds in objects.annotations:
        uid = referenced_series(path, ds)
        if uid not in site_of:
            raise DataError(f"{path}: its referenced image series {uid} is absent from {src}")
        sites[site_of[uid]].annotations.append((path, ds))
    return sites
