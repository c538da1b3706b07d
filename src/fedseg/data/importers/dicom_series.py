"""DICOM image series: files grouped by SeriesInstanceUID (whatever their names), slices
ordered along the slice normal, pixel data in modality units (CT: Hounsfield units) and the
voxel-to-patient geometry.

A :class:`Series` is a stack of single-frame slices ``(D, H, W)``: ``D`` runs along the slice
normal (row direction x column direction of ImageOrientationPatient) in increasing
ImagePositionPatient projection, never in file order; ``H`` the rows, ``W`` the columns.
Its ``affine`` maps voxel indices ``(k, row, column)`` to patient coordinates (LPS, mm).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedseg.errors import DataError

try:
    import pydicom
    from pydicom.dataset import Dataset
    from pydicom.errors import InvalidDicomError
    from pydicom.pixels import apply_modality_lut, get_decoder
except ImportError:  # the dicom extra
    raise DataError(
        "DICOM support needs pydicom and highdicom: pip install 'fedseg[dicom]'"
    ) from None

__all__ = [
    "ANNOTATION_MODALITIES",
    "DicomObjects",
    "Series",
    "assemble",
    "find_objects",
    "from_ras",
    "series_hash",
    "to_ras",
]

ANNOTATION_MODALITIES = ("SEG", "RTSTRUCT")
_NO_IMAGE = ("SR", "PR", "KO", "REG", "RTPLAN", "RTDOSE", "RTRECORD", "DOC")
_TOLERANCE = 0.01
"""Relative tolerance of slice steps and direction cosines (1 %)."""


def series_hash(uid: str) -> str:
    """SHA-256 (hex) of a SeriesInstanceUID: what leaves the site instead of the UID."""
    return hashlib.sha256(uid.encode()).hexdigest()


@dataclass(frozen=True)
class Series:
    """One image series, its slices sorted along the slice normal (see the module doc)."""

    uid: str
    modality: str
    paths: list[Path]
    headers: list[Dataset]
    """The slices' headers (no pixel data), in slice order."""
    affine: np.ndarray
    """(4, 4): voxel ``(k, row, column)`` -> patient LPS coordinates in mm."""

    @property
    def name(self) -> str:
        """How messages name the series: its folder and the first digits of its hash."""
        return f"series {series_hash(self.uid)[:12]} in {self.paths[0].parent}"

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.paths), int(self.headers[0].Rows), int(self.headers[0].Columns)

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size (slice step, row spacing, column spacing) in mm."""
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :3], axis=0))  # type: ignore[return-value]

    @property
    def sop_uids(self) -> list[str]:
        return [str(h.SOPInstanceUID) for h in self.headers]

    def pixels(self) -> np.ndarray:
        """The volume ``(D, H, W)`` as float32 in modality units (RescaleSlope/Intercept or the
        Modality LUT applied: Hounsfield units for CT)."""
        out = np.empty(self.shape, np.float32)
        for k, path in enumerate(self.paths):
            try:
                ds = pydicom.dcmread(path)
                data = apply_modality_lut(ds.pixel_array, ds)
            except Exception as e:  # a damaged file fails in many ways; each is that file's
                raise DataError(f"{path}: pixel data cannot be decoded ({e})") from None
            if data.shape != self.shape[1:]:
                raise DataError(
                    f"{path}: pixel data of shape {data.shape}; a slice of {self.name} has "
                    f"{self.shape[1]} x {self.shape[2]} grey values (colour is not supported)"
                )
            out[k] = data
        return out

    def index_of(self, points: np.ndarray) -> np.ndarray:
        """Continuous voxel indices ``(k, row, column)`` of patient points ``(N, 3)`` (mm)."""
        inverse = np.linalg.inv(self.affine)
        return points @ inverse[:3, :3].T + inverse[:3, 3]


@dataclass
class DicomObjects:
    """The DICOM objects of a folder: image series by UID, SEG and RTSTRUCT files."""

    images: dict[str, list[tuple[Path, Dataset]]]
    annotations: list[tuple[Path, Dataset]]


def find_objects(files: Iterable[Path]) -> DicomObjects:
    """Read the headers of ``files`` (anything that is not DICOM is skipped) and sort them into
    image slices (by SeriesInstanceUID) and annotation objects (SEG, RTSTRUCT).

    Raises:
        DataError: an image slice whose pixel data are compressed with a transfer syntax no
            installed decoder handles (naming the packages that would), or a multi-frame image.
    """
    images: dict[str, list[tuple[Path, Dataset]]] = {}
    annotations = []
    for path in sorted(files):
        if not path.is_file():
            continue
        ds = _header(path)
        if ds is None:
            continue
        modality = str(ds.get("Modality", ""))
        if modality in ANNOTATION_MODALITIES:
            annotations.append((path, ds))
        elif modality not in _NO_IMAGE and "Rows" in ds and "SeriesInstanceUID" in ds:
            if int(ds.get("NumberOfFrames", 1) or 1) > 1:
                raise DataError(
                    f"{path}: a multi-frame {modality} image; import-dicom reads series of "
                    "single-frame slices (export the series as classic single-frame images)"
                )
            _check_decoder(path, ds)
            images.setdefault(str(ds.SeriesInstanceUID), []).append((path, ds))
    return DicomObjects(images, annotations)


def _header(path: Path) -> Dataset | None:
    """The header of the DICOM file ``path`` (also one without the 'DICM' preamble, as older
    files are), or None when it is no DICOM object."""
    for force in (False, True):
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True, force=force)
        except InvalidDicomError:
            continue
        except Exception:  # forced reads of other files fail in many ways
            return None
        return ds if "SOPClassUID" in ds and "Modality" in ds else None
    return None


def _check_decoder(path: Path, ds: Dataset) -> None:
    meta = getattr(ds, "file_meta", None)
    syntax = None if meta is None else meta.get("TransferSyntaxUID")
    if syntax is None or not syntax.is_compressed:
        return
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError:
        raise DataError(
            f"{path}: pixel data are compressed with {syntax.name}, which pydicom cannot decode"
        ) from None
    if not decoder.is_available:
        raise DataError(
            f"{path}: pixel data are compressed with {syntax.name} and no decoder for it is "
            f"installed; install one of: {'; '.join(decoder.missing_dependencies)} "
            "(e.g. pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg)"
        )


def _usual_grid(slices: list[tuple[Path, Dataset]]) -> Dataset:
    """The first slice of the grid (size, orientation, pixel spacing) most slices share, so
    that a refusal names the odd slice whatever the files' order."""

    def grid(ds: Dataset) -> tuple:
        rounded = [round(float(v), 4) for v in (*ds.ImageOrientationPatient, *ds.PixelSpacing)]
        return (int(ds.Rows), int(ds.Columns), *rounded)

    keys = [grid(ds) for _, ds in slices]
    usual = max(keys, key=keys.count)
    return slices[keys.index(usual)][1]


def assemble(uid: str, slices: list[tuple[Path, Dataset]]) -> Series:
    """The :class:`Series` of ``slices``, sorted along the slice normal.

    Raises:
        DataError: slices without geometry, differing orientation, grid or pixel spacing, two
            slices at one position, missing slices (a gap in the positions) or uneven steps.
    """
    where = f"series {series_hash(uid)[:12]} in {slices[0][0].parent}"
    for path, ds in slices:
        for key in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing"):
            if key not in ds:
                raise DataError(f"{path}: no {key}; import-dicom needs the slice geometry")
    first = _usual_grid(slices)
    orientation = np.array(first.ImageOrientationPatient, float)
    pixel = np.array(first.PixelSpacing, float)
    for path, ds in slices:
        if (ds.Rows, ds.Columns) != (first.Rows, first.Columns):
            raise DataError(
                f"{path}: {ds.Rows} x {ds.Columns} pixels, other slices of {where} have "
                f"{first.Rows} x {first.Columns}"
            )
        if not np.allclose(ds.ImageOrientationPatient, orientation, atol=_TOLERANCE):
            raise DataError(f"{path}: ImageOrientationPatient differs from the rest of {where}")
        if not np.allclose(ds.PixelSpacing, pixel, rtol=_TOLERANCE):
            raise DataError(
                f"{path}: inconsistent spacing: PixelSpacing {list(map(float, ds.PixelSpacing))}"
                f" mm, other slices of {where} have {pixel.tolist()} mm"
            )
    row_dir, col_dir = orientation[:3], orientation[3:]
    normal = np.cross(row_dir, col_dir)
    positions = np.array([ds.ImagePositionPatient for _, ds in slices], float)
    depth = positions @ normal
    order = np.argsort(depth, kind="stable")
    depth, positions = depth[order], positions[order]
    steps = np.diff(depth)
    paths = [slices[i][0] for i in order]
    if len(steps) and steps.min() < 1e-3:
        k = int(steps.argmin())
        raise DataError(
            f"{where}: {paths[k].name} and {paths[k + 1].name} lie at the same position "
            f"({depth[k]:.2f} mm along the slice normal); one series, one slice per position"
        )
    step = float(np.median(steps)) if len(steps) else _thickness(first)
    if len(steps) and steps.max() > 1.5 * step:
        k = int(steps.argmax())
        missing = round(steps[k] / step) - 1
        raise DataError(
            f"{where}: missing slices: a gap of {steps[k]:.2f} mm between {paths[k].name} and "
            f"{paths[k + 1].name} where slices are {step:.2f} mm apart (about {missing} missing)"
        )
    if len(steps) and np.abs(steps - step).max() > _TOLERANCE * step + 1e-3:
        raise DataError(
            f"{where}: inconsistent spacing: slice steps range from {steps.min():.3f} to "
            f"{steps.max():.3f} mm; resample the series to even steps first"
        )
    affine = np.eye(4)
    affine[:3, 0] = (positions[-1] - positions[0]) / len(steps) if len(steps) else normal * step
    affine[:3, 1] = col_dir * pixel[0]  # down the rows: the column direction, row spacing
    affine[:3, 2] = row_dir * pixel[1]  # along a row: the row direction, column spacing
    affine[:3, 3] = positions[0]
    return Series(uid, str(first.get("Modality", "")), paths, [slices[i][1] for i in order], affine)


def _thickness(ds: Dataset) -> float:
    for key in ("SpacingBetweenSlices", "SliceThickness"):
        value = ds.get(key)
        if value is not None and float(value) > 0:
            return float(value)
    return 1.0


def to_ras(array: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``array`` ``(D, H, W)`` on the grid of ``affine`` (LPS) reoriented to the closest RAS
    axes (x, y, z), as ``import-nifti`` reorients NIfTI volumes; returns the reoriented array,
    its voxel size (x, y, z) in mm and the nibabel orientation that did it (undone by
    :func:`from_ras`)."""
    import nibabel as nib

    ras = np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine
    ornt = nib.orientations.io_orientation(ras)
    zooms = np.empty(3)
    zooms[ornt[:, 0].astype(int)] = np.linalg.norm(affine[:3, :3], axis=0)
    return nib.orientations.apply_orientation(array, ornt), zooms, ornt


def from_ras(array: np.ndarray, ornt: np.ndarray) -> np.ndarray:
    """Undo :func:`to_ras`: an array (x, y, z) back on the series grid ``(D, H, W)``."""
    import nibabel as nib

    identity = np.array([[0, 1], [1, 1], [2, 1]], float)
    return nib.orientations.apply_orientation(
        array, nib.orientations.ornt_transform(identity, ornt)
    )
