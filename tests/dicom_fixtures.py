"""Writers of tiny DICOM test data: CT series, DICOM-SEGs (highdicom) and RT Structure Sets.

Imported by the DICOM tests (``tests/`` is on ``sys.path`` through its conftest). File names
are random, so importers must order slices by their geometry, never by name.
"""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.sr.codedict import codes
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

CT_IMAGE = "1.2.840.10008.5.1.4.1.1.2"
RT_STRUCT = "1.2.840.10008.5.1.4.1.1.481.3"


def _file_meta(sop_class: str, sop_uid: str) -> FileMetaDataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    return meta


def _patient(ds: Dataset, patient: str, study_uid: str) -> None:
    ds.PatientName, ds.PatientID = f"Doe^{patient}", patient
    ds.PatientBirthDate, ds.PatientSex = "19700101", "O"
    ds.StudyInstanceUID, ds.StudyID = study_uid, "1"
    ds.StudyDate = ds.SeriesDate = datetime.date(2026, 1, 1).strftime("%Y%m%d")
    ds.StudyTime = ds.SeriesTime = "120000"
    ds.AccessionNumber, ds.ReferringPhysicianName = "", ""


def ct_series(
    folder: Path,
    hu: np.ndarray,
    *,
    spacing: Sequence[float] = (3.0, 0.8, 0.8),
    origin: Sequence[float] = (-20.0, -20.0, 10.0),
    orientation: Sequence[float] = (1, 0, 0, 0, 1, 0),
    positions: Sequence[Sequence[float]] | None = None,
    institution: str = "Hospital",
    patient: str = "P1",
    series_uid: str | None = None,
) -> list[Dataset]:
    """Write ``hu`` ``(D, H, W)`` (Hounsfield units) as a CT series into ``folder`` (stored as
    pixel value = HU + 1024, RescaleIntercept -1024) and return its datasets in slice order.

    Slice ``k`` lies at ``origin + k * spacing[0] * normal`` unless ``positions`` are given.
    """
    folder.mkdir(parents=True, exist_ok=True)
    iop = np.asarray(orientation, float)
    normal = np.cross(iop[:3], iop[3:])
    study, series, frame = generate_uid(), series_uid or generate_uid(), generate_uid()
    out = []
    for k, plane in enumerate(hu):
        uid = generate_uid()
        ds = Dataset()
        ds.file_meta = _file_meta(CT_IMAGE, uid)
        _patient(ds, patient, study)
        ds.SOPClassUID, ds.SOPInstanceUID = CT_IMAGE, uid
        ds.Modality, ds.Manufacturer, ds.InstitutionName = "CT", "test", institution
        ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = series, 1, k + 1
        ds.FrameOfReferenceUID, ds.PositionReferenceIndicator = frame, ""
        pos = (
            positions[k] if positions is not None else np.asarray(origin) + k * spacing[0] * normal
        )
        ds.ImagePositionPatient = [float(v) for v in pos]
        ds.ImageOrientationPatient = [float(v) for v in iop]
        ds.PixelSpacing = [float(spacing[1]), float(spacing[2])]
        ds.SliceThickness = float(spacing[0])
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = -1024, 1, "HU"
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.PixelData = (np.asarray(plane) + 1024).astype(np.uint16).tobytes()
        ds.save_as(folder / f"{secrets.token_hex(6)}.dcm", enforce_file_format=True)
        out.append(ds)
    return out


def seg_file(
    path: Path, series: Sequence[Dataset], labels: np.ndarray, names: Sequence[str]
) -> Path:
    """A BINARY DICOM-SEG of ``labels`` (``(D, H, W)``, values 1..len(names)) on ``series``."""
    segments = [
        hd.seg.SegmentDescription(
            segment_number=k,
            segment_label=name,
            segmented_property_category=codes.SCT.Tissue,
            segmented_property_type=codes.SCT.Tissue,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL,
        )
        for k, name in enumerate(names, start=1)
    ]
    seg = hd.seg.Segmentation(
        source_images=list(series),
        pixel_array=labels.astype(np.uint8),
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=segments,
        series_instance_uid=hd.UID(),
        series_number=2,
        sop_instance_uid=hd.UID(),
        instance_number=1,
        manufacturer="test",
        manufacturer_model_name="test",
        software_versions="1",
        device_serial_number="1",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return path


def box_contour(ds: Dataset, r0: float, r1: float, c0: float, c1: float) -> list[float]:
    """Contour data (x, y, z, ...) of the box of rows ``r0..r1`` and columns ``c0..c1`` of the
    slice ``ds`` (the corners lie on pixel edges, so exactly those pixels are inside)."""
    iop = np.asarray(ds.ImageOrientationPatient, float)
    dr, dc = (float(v) for v in ds.PixelSpacing)
    origin = np.asarray(ds.ImagePositionPatient, float)
    corners = [
        (r0 - 0.5, c0 - 0.5),
        (r0 - 0.5, c1 + 0.5),
        (r1 + 0.5, c1 + 0.5),
        (r1 + 0.5, c0 - 0.5),
    ]
    points = [origin + r * dr * iop[3:] + c * dc * iop[:3] for r, c in corners]
    return [float(v) for p in points for v in p]


def rtstruct_file(
    path: Path,
    series: Sequence[Dataset],
    rois: Mapping[str, Mapping[int, Sequence[Sequence[float]]]],
) -> Path:
    """An RT Structure Set on ``series``: ``rois`` maps ROI names to {slice index: contours},
    each contour a flat (x, y, z, ...) list (see :func:`box_contour`)."""
    first = series[0]
    uid = generate_uid()
    ds = Dataset()
    ds.file_meta = _file_meta(RT_STRUCT, uid)
    _patient(ds, str(first.PatientID), str(first.StudyInstanceUID))
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = RT_STRUCT, uid, "RTSTRUCT"
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), 3, 1
    ds.Manufacturer, ds.StructureSetLabel = "test", "contours"
    ds.StructureSetDate, ds.StructureSetTime = "20260101", "120000"
    contour_images = DicomSequence()
    for s in series:
        item = Dataset()
        item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = CT_IMAGE, s.SOPInstanceUID
        contour_images.append(item)
    ref_series = Dataset()
    ref_series.SeriesInstanceUID, ref_series.ContourImageSequence = (
        first.SeriesInstanceUID,
        contour_images,
    )
    ref_study = Dataset()
    ref_study.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"
    ref_study.ReferencedSOPInstanceUID = first.StudyInstanceUID
    ref_study.RTReferencedSeriesSequence = DicomSequence([ref_series])
    frame = Dataset()
    frame.FrameOfReferenceUID = first.FrameOfReferenceUID
    frame.RTReferencedStudySequence = DicomSequence([ref_study])
    ds.ReferencedFrameOfReferenceSequence = DicomSequence([frame])
    ds.StructureSetROISequence, ds.ROIContourSequence = DicomSequence(), DicomSequence()
    ds.RTROIObservationsSequence = DicomSequence()
    for number, (name, slices) in enumerate(rois.items(), start=1):
        roi = Dataset()
        roi.ROINumber, roi.ROIName, roi.ROIGenerationAlgorithm = number, name, "MANUAL"
        roi.ReferencedFrameOfReferenceUID = first.FrameOfReferenceUID
        ds.StructureSetROISequence.append(roi)
        contours = DicomSequence()
        for k, polygons in slices.items():
            for data in polygons:
                c = Dataset()
                image = Dataset()
                image.ReferencedSOPClassUID = CT_IMAGE
                image.ReferencedSOPInstanceUID = series[k].SOPInstanceUID
                c.ContourImageSequence = DicomSequence([image])
                c.ContourGeometricType, c.NumberOfContourPoints = "CLOSED_PLANAR", len(data) // 3
                c.ContourData = list(data)
                contours.append(c)
        item = Dataset()
        item.ReferencedROINumber, item.ROIDisplayColor = number, [255, 0, 0]
        item.ContourSequence = contours
        ds.ROIContourSequence.append(item)
        obs = Dataset()
        obs.ObservationNumber, obs.ReferencedROINumber = number, number
        obs.RTROIInterpretedType, obs.ROIInterpreter = "ORGAN", ""
        ds.RTROIObservationsSequence.append(obs)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path
