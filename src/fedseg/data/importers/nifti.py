"""Import NIfTI volumes per site, as 2D slices or as 3D volumes.

Layout: ``SRC/<site>/images/<case>.nii.gz`` with ``SRC/<site>/labels/<case>.nii.gz``, or
side by side as ``<case>.nii.gz`` + ``<case><mask_suffix>.nii.gz``; optionally pre-split into
``SRC/<site>/{train,test}/``. Volumes are reoriented to RAS (``nibabel.as_closest_canonical``),
optionally resampled to one voxel spacing for the whole federation, and intensities scaled to
[0, 1] (per volume, or by a CT window in HU); splits are drawn per case, never per slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nibabel as nib
import numpy as np

from fedseg.data.arrays import normalize_intensity
from fedseg.data.federation import unreadable
from fedseg.data.importers.common import (
    apply_window,
    assign_splits,
    check_window,
    find_pairs,
    map_levels,
    site_annotations,
    site_dirs,
)
from fedseg.data.importers.samples import each_case, write_case
from fedseg.data.manifest import Annotation, BoxConversion, Manifest
from fedseg.data.resample import INTERPOLATIONS, Interpolation, resample_image, resample_mask
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

__all__ = [
    "NiftiImport",
    "check_volume_options",
    "import_nifti",
    "load_volume",
    "resample_case",
]

NIFTI_EXTENSIONS = (".nii", ".nii.gz")


@dataclass(frozen=True)
class NiftiImport:
    """What an import produced: the manifest and how many empty slices were dropped."""

    manifest: Manifest
    dropped_slices: int


def import_nifti(
    src: str | Path,
    out: str | Path,
    *,
    class_names: Sequence[str],
    mode: Literal["2d", "3d"],
    shape: Sequence[int],
    axis: int = 2,
    fit: Literal["resize", "crop"] | None = None,
    drop_empty: bool = True,
    mapping: Mapping[int, int] | None = None,
    images_dir: str = "images",
    masks_dir: str = "labels",
    mask_suffix: str = "",
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    task: str = "imported",
    modality: str = "MRI",
    ct_window: tuple[float, float] | None = None,
    spacing: Sequence[float] | None = None,
    interpolation: Interpolation = "linear",
    annotations: Mapping[str, Annotation] | None = None,
    box_conversion: BoxConversion = "block",
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> NiftiImport:
    """Convert per-site NIfTI image/label volumes in ``src`` into a federation folder ``out``.

    ``mode="2d"`` cuts every volume into slices along ``axis`` (after RAS reorientation; 2 =
    axial), drops slices whose mask is empty when ``drop_empty``, and fits each slice to
    ``shape`` (H, W). ``mode="3d"`` keeps volumes, moves ``axis`` first (D, H, W) and fits them
    to ``shape``. ``fit`` is ``resize`` or centre ``crop``/pad; the default is ``resize``, or
    ``crop`` with ``spacing``. Spacing comes from the affine and follows resizing.

    ``spacing`` (mm; (H, W) in 2D, (D, H, W) in 3D, axis order after moving ``axis`` first)
    resamples every volume to that voxel spacing first (images ``interpolation``, labels
    nearest neighbour), so one pixel is the same size at every site; resizing afterwards would
    undo that, so ``spacing`` needs ``fit="crop"``. ``modality="CT"`` needs ``ct_window``
    (LOW, HIGH in HU): intensities are clipped to it and scaled to [0, 1] instead of the
    per-volume percentile scaling. Label values map through ``mapping`` (value -> class) or
    must already be classes.
    """
    _, fit = check_volume_options(mode, shape, axis, fit, spacing, interpolation)
    is_ct = modality.strip().upper() == "CT"
    check_window(ct_window, "--ct-window")
    if is_ct != (ct_window is not None):
        raise DataError(
            "--modality CT needs --ct-window LOW,HIGH in HU (e.g. -160,240 for abdominal soft "
            f"tissue), and a CT window needs --modality CT; got modality {modality!r}, "
            f"window {ct_window}"
        )
    src = Path(src)
    plan = {}
    for site in site_dirs(src):
        parts = {s: site / s for s in ("train", "test") if (site / s).is_dir()}
        cases = {
            (split, case): (img, lab)
            for split, folder in (parts or {"": site}).items()
            for case, img, lab in find_pairs(
                folder,
                images_dir=images_dir,
                masks_dir=masks_dir,
                extensions=NIFTI_EXTENSIONS,
                mask_suffix=mask_suffix,
            )
        }
        keys = {f"{split}/{case}": (split, case) for split, case in cases}
        given = {k: v[0] for k, v in keys.items()} if parts else None
        splits = assign_splits(
            list(keys),
            test_fraction=test_fraction,
            val_fraction=val_fraction,
            seed=seed,
            given=given,
        )
        plan[site.name] = [(keys[k][1], *cases[keys[k]], splits[k]) for k in keys]
    chosen = site_annotations(annotations, list(plan), src)
    with FederationWriter(
        Path(out),
        task=task,
        class_names=class_names,
        modality=modality,
        channels=1,
        spatial_shape=tuple(shape),
        box_conversion=box_conversion,
        source=f"imported from NIfTI volumes in {src}",
        overwrite=overwrite,
    ) as writer:
        dropped = 0
        for site, (case, img_path, lab_path, split) in each_case(plan, progress):
            raw, label, zooms = _read_case(img_path, lab_path, axis, mapping, len(class_names))
            raw, label, zooms = resample_case(raw, label, zooms, spacing, interpolation)
            image = normalize_intensity(raw) if ct_window is None else apply_window(raw, ct_window)
            dropped += write_case(
                writer,
                site,
                split,
                case,
                image[None],
                label,
                zooms,
                shape=shape,
                fit=fit,
                drop_empty=drop_empty,
                origin=str(img_path),
            )
        return NiftiImport(writer.finish(chosen), dropped)


def check_volume_options(
    mode: str,
    shape: Sequence[int],
    axis: int,
    fit: str | None,
    spacing: Sequence[float] | None,
    interpolation: str = "linear",
) -> tuple[int, Literal["resize", "crop"]]:
    """``(ndim, fit)`` of a volume import; ``fit`` defaults to ``crop`` with ``spacing``.

    Raises:
        DataError: a mode without a matching shape, an axis outside 0..2, an unknown fit or
            interpolation, or a spacing of the wrong length, not positive, or with resizing.
    """
    ndim = {"2d": 2, "3d": 3}.get(mode)
    fit = fit or ("crop" if spacing is not None else "resize")
    if ndim is None or len(shape) != ndim or axis not in (0, 1, 2) or fit not in ("resize", "crop"):
        raise DataError(
            f"need mode 2d with a (H, W) shape or 3d with a (D, H, W) shape, axis in 0..2 and "
            f"fit resize|crop; got mode={mode!r}, shape={tuple(shape)}, axis={axis}, fit={fit!r}"
        )
    if spacing is not None and (
        len(spacing) != ndim or fit != "crop" or not all(0 < v < math.inf for v in spacing)
    ):
        raise DataError(
            f"--spacing needs {ndim} positive values in mm in {mode} mode "
            f"({'H,W' if ndim == 2 else 'D,H,W'}) and --fit crop (resizing would change the "
            f"spacing again); got spacing {tuple(spacing)}, fit {fit!r}"
        )
    if interpolation not in INTERPOLATIONS:
        raise DataError(f"--interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}")
    return ndim, fit  # type: ignore[return-value]  # checked above


def resample_case(
    image: np.ndarray,
    label: np.ndarray,
    zooms: Sequence[float],
    spacing: Sequence[float] | None,
    interpolation: Interpolation,
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Image ([C,] D, H, W) and label (D, H, W) with voxel size ``zooms`` resampled to
    ``spacing``: (D, H, W), or (H, W) with the slices (D) kept as they are; unchanged when
    ``spacing`` is None."""
    if spacing is None:
        return image, label, tuple(zooms)
    target = (zooms[0], *spacing) if len(spacing) == 2 else tuple(spacing)
    return (
        resample_image(image, zooms, target, interpolation),
        resample_mask(label, zooms, target),
        target,
    )


def _read_case(
    img_path: Path, lab_path: Path, axis: int, mapping: Mapping[int, int] | None, k: int
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Raw volume and label with ``axis`` first, RAS-oriented; voxel spacing from the affine
    in the same axis order."""
    img, data = load_volume(img_path, "image")
    _, raw = load_volume(lab_path, "label")
    if data.shape != raw.shape:
        raise DataError(
            f"{img_path}: image volume {data.shape} and its label {lab_path} {raw.shape} "
            "differ in shape"
        )
    label = np.rint(raw).astype(np.int64)
    if not np.array_equal(label, raw):
        raise DataError(f"{lab_path}: label values must be integers")
    if mapping is not None:
        label = map_levels(label, dict(mapping), 0, str(lab_path))
    bad = sorted(set(np.unique(label).tolist()) - set(range(k)))
    if bad:
        raise DataError(f"{lab_path}: label values must be classes 0..{k - 1}, got {bad[:10]}")
    zooms = [float(z) for z in nib.affines.voxel_sizes(img.affine)]
    order = [axis] + [a for a in range(3) if a != axis]
    image = np.transpose(data, order)
    return image, np.transpose(label, order).astype(np.uint8), tuple(zooms[a] for a in order)


def load_volume(
    path: Path, what: str, channels: bool = False
) -> tuple[nib.Nifti1Image, np.ndarray]:
    """The RAS-oriented volume at ``path`` (trailing axes of size 1 dropped) and its data as
    float32, (x, y, z); with ``channels`` a 4D file (x, y, z, C) is accepted too and the data
    come as (C, x, y, z). DataError naming the file when it is damaged, truncated or of the
    wrong dimension."""
    try:
        volume = nib.squeeze_image(nib.load(path))
        if volume.ndim == 3 or (channels and volume.ndim == 4):
            parts = [volume] if volume.ndim == 3 else nib.four_to_three(volume)
            parts = [nib.as_closest_canonical(v) for v in parts]
            data = [v.get_fdata(dtype=np.float32) for v in parts]
            return parts[0], np.stack(data) if channels else data[0]
    except Exception as e:  # every way a damaged file fails to parse is that file's problem
        raise DataError(unreadable(path, e, "a NIfTI volume")) from None
    wanted = "a 3D volume (x, y, z)" + (" or 4D (x, y, z, channel)" if channels else "")
    raise DataError(f"{path}: {what} must be {wanted}, got shape {volume.shape}")
