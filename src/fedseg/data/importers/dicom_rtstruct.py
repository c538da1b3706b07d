"""RT Structure Sets (RTSTRUCT): planar contours rasterised on the referenced series' grid.

Each closed contour is projected into the voxel grid of its slice (patient mm -> row, column
through the series' geometry) and filled with scikit-image's ``polygon2mask`` (a pixel is
inside when its centre is). Contours of one ROI on one slice combine by even-odd (XOR), so a
contour inside another cuts a hole (holes drawn as DICOM's "keyhole" contours fill correctly
either way). Point and open contours enclose no area and are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from skimage.draw import polygon2mask

from fedseg.data.importers.dicom_seg import paint
from fedseg.data.importers.dicom_series import Series
from fedseg.errors import DataError

try:
    from pydicom.dataset import Dataset
except ImportError:  # the dicom extra
    raise DataError(
        "DICOM support needs pydicom and highdicom: pip install 'fedseg[dicom]'"
    ) from None

__all__ = ["read_rtstruct", "roi_names"]

_OFF_SLICE = 0.25
"""How far (in slice steps) a contour may lie from the nearest slice."""


def roi_names(ds: Dataset) -> dict[int, str]:
    """ROI number -> ROIName of an RT Structure Set."""
    return {int(r.ROINumber): str(r.ROIName) for r in ds.get("StructureSetROISequence", [])}


def read_rtstruct(
    path: Path, ds: Dataset, series: Series, classes: Mapping[int, int]
) -> np.ndarray:
    """The label map ``(D, H, W)`` on ``series``' grid of the RT Structure Set ``ds`` (read
    from ``path``): ROI numbers map to classes through ``classes``; other ROIs are ignored.

    Raises:
        DataError: a frame of reference other than the series', or a contour lying on none of
            its slices (the mask grid does not match its image).
    """
    frame = str(series.headers[0].get("FrameOfReferenceUID", ""))
    for ref in ds.get("ReferencedFrameOfReferenceSequence", []):
        if frame and str(ref.FrameOfReferenceUID) != frame:
            raise DataError(
                f"{path}: the mask grid does not match its image {series.name}: the contours "
                "use another frame of reference (FrameOfReferenceUID) than the series"
            )
    names = roi_names(ds)
    depth, rows, cols = series.shape
    layers: dict[int, np.ndarray] = {}
    for item in ds.get("ROIContourSequence", []):
        number = int(item.ReferencedROINumber)
        if number not in classes:
            continue
        mask = np.zeros(series.shape, bool)
        for contour in item.get("ContourSequence", []):
            if contour.get("ContourGeometricType", "CLOSED_PLANAR") != "CLOSED_PLANAR":
                continue
            points = np.asarray(contour.ContourData, float).reshape(-1, 3)
            index = series.index_of(points)
            k = int(np.rint(index[:, 0].mean()))
            if np.abs(index[:, 0] - k).max() > _OFF_SLICE or not 0 <= k < depth:
                raise DataError(
                    f"{path}: the mask grid does not match its image {series.name}: a contour "
                    f"of ROI {names.get(number, number)!r} lies at slice index "
                    f"{index[:, 0].mean():.2f}, not on one of its {depth} slices"
                )
            mask[k] ^= polygon2mask((rows, cols), index[:, 1:])
        cls = classes[number]
        layers[cls] = layers.get(cls, False) | mask
    return paint(series.shape, layers)
