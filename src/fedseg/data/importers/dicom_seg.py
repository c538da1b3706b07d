"""DICOM Segmentation objects (DICOM-SEG), read and written with highdicom.

:func:`read_seg` gives a SEG's segments as one label map on the grid of its referenced image
series; :func:`write_seg` writes a label map on a series' grid as a BINARY SEG with one
segment per foreground class, referencing every slice of the series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedseg.data.importers.dicom_series import Series
from fedseg.errors import DataError

try:
    import highdicom as hd
    from pydicom.dataset import Dataset
    from pydicom.sr.codedict import codes
except ImportError:  # the dicom extra
    raise DataError(
        "DICOM support needs pydicom and highdicom: pip install 'fedseg[dicom]'"
    ) from None

__all__ = ["paint", "read_seg", "referenced_series", "segment_names", "write_seg"]


def referenced_series(path: Path, ds: Dataset) -> str:
    """SeriesInstanceUID of the image series a SEG or RTSTRUCT was drawn on."""
    try:
        if ds.Modality == "SEG":
            return str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID)
        ref = ds.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence[0]
        return str(ref.RTReferencedSeriesSequence[0].SeriesInstanceUID)
    except (AttributeError, IndexError):
        raise DataError(f"{path}: a {ds.Modality} that names no referenced image series") from None


def segment_names(ds: Dataset) -> dict[int, str]:
    """Segment number -> SegmentLabel of a SEG."""
    return {int(s.SegmentNumber): str(s.SegmentLabel) for s in ds.SegmentSequence}


def paint(shape: Sequence[int], layers: Mapping[int, np.ndarray]) -> np.ndarray:
    """One label map from binary ``layers`` {class: mask}; where layers overlap the higher
    class wins (a tumour drawn inside its organ stays the tumour). Class 0 paints nothing."""
    out = np.zeros(tuple(shape), np.uint8)
    for cls in sorted(layers):
        if cls > 0:
            out[layers[cls]] = cls
    return out


def read_seg(path: Path, series: Series, classes: Mapping[int, int]) -> np.ndarray:
    """The label map ``(D, H, W)`` on ``series``' grid of the SEG at ``path``: segment numbers
    map to classes through ``classes``; fractional segments count where >= 0.5.

    Raises:
        DataError: the SEG's grid (rows, columns, pixel spacing, orientation) differs from the
            series', or its frames reference instances the series does not hold.
    """
    try:
        seg = hd.seg.segread(path)
    except Exception as e:  # a damaged file fails in many ways
        raise DataError(f"{path}: not a readable DICOM-SEG ({e})") from None
    _check_grid(path, seg, series)
    numbers = sorted(classes)
    try:
        pixels = seg.get_pixels_by_source_instance(
            source_sop_instance_uids=series.sop_uids,
            segment_numbers=numbers,
            assert_missing_frames_are_empty=True,
            dtype=np.float32,
        )
    except (ValueError, KeyError, AttributeError) as e:
        raise DataError(
            f"{path}: the mask grid does not match its image {series.name}: its frames cannot "
            f"be placed on the series' slices ({e})"
        ) from None
    layers: dict[int, np.ndarray] = {}
    for j, number in enumerate(numbers):
        cls = classes[number]
        layers[cls] = layers.get(cls, False) | (pixels[..., j] >= 0.5)
    return paint(series.shape, layers)


def _check_grid(path: Path, seg: Dataset, series: Series) -> None:
    rows, cols = series.shape[1:]
    found = f"{seg.Rows} x {seg.Columns} pixels"
    want = f"{rows} x {cols} pixels"
    shared = seg.SharedFunctionalGroupsSequence[0]
    measures = getattr(shared, "PixelMeasuresSequence", None)
    if measures is not None and "PixelSpacing" in measures[0]:
        spacing = [float(v) for v in measures[0].PixelSpacing]
        found += f" at {spacing} mm"
        want += f" at {list(series.spacing[1:])} mm"
        same = np.allclose(spacing, series.spacing[1:], rtol=0.01)
    else:
        same = True
    orient = getattr(shared, "PlaneOrientationSequence", None)
    turned = False
    if orient is not None:
        iop = np.concatenate([series.affine[:3, 2], series.affine[:3, 1]])
        iop /= np.repeat(np.linalg.norm(iop.reshape(2, 3), axis=1), 3)
        turned = not np.allclose(orient[0].ImageOrientationPatient, iop, atol=0.01)
    if (seg.Rows, seg.Columns) != (rows, cols) or not same or turned:
        raise DataError(
            f"{path}: the mask grid does not match its image {series.name}: {found}"
            f"{', another ImageOrientationPatient' if turned else ''}, the series has {want}"
        )


def write_seg(
    labels: np.ndarray,
    series: Series,
    class_names: Sequence[str],
    path: Path,
    *,
    algorithm: str = "fedseg",
    version: str = "0",
) -> Path:
    """Write ``labels`` ``(D, H, W)`` (on ``series``' grid, classes 0..K-1) as a BINARY
    DICOM-SEG at ``path`` with one segment per foreground class (segment number = class
    index, SegmentLabel = class name), referencing every slice of ``series``."""
    if labels.shape != series.shape:
        raise DataError(
            f"{path}: labels of shape {labels.shape} do not lie on the grid of {series.name} "
            f"{series.shape}"
        )
    family = codes.cid7162.ArtificialIntelligence
    algo = hd.AlgorithmIdentificationSequence(name=algorithm, family=family, version=version)
    segments = [
        hd.seg.SegmentDescription(
            segment_number=k,
            segment_label=name,
            segmented_property_category=codes.SCT.Tissue,
            segmented_property_type=codes.SCT.Tissue,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
            algorithm_identification=algo,
        )
        for k, name in enumerate(class_names)
        if k > 0
    ]
    try:
        seg = _segmentation(labels, series, segments, algorithm, version)
    except (AttributeError, ValueError, TypeError) as e:  # headers highdicom cannot copy
        raise DataError(f"{path}: no DICOM-SEG can be written on {series.name} ({e})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return path


def _segmentation(
    labels: np.ndarray,
    series: Series,
    segments: list[hd.seg.SegmentDescription],
    algorithm: str,
    version: str,
) -> hd.seg.Segmentation:
    return hd.seg.Segmentation(
        source_images=series.headers,
        pixel_array=labels.astype(np.uint8),
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=segments,
        series_instance_uid=hd.UID(),
        series_number=int(series.headers[0].get("SeriesNumber", 0) or 0) + 1000,
        sop_instance_uid=hd.UID(),
        instance_number=1,
        manufacturer="fedseg",
        manufacturer_model_name=algorithm,
        software_versions=version,
        device_serial_number="0",
        omit_empty_frames=False,
    )
