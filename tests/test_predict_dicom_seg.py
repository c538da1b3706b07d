"""``fedseg predict --format dicom-seg``: a DICOM-SEG per input series that references it, one
segment per class, which ``import-dicom`` reads back to the predicted mask."""

from __future__ import annotations

from pathlib import Path

import highdicom as hd
import numpy as np
import pytest
import torch
from torch import nn

from dicom_fixtures import ct_series
from fedseg.data.importers.dicom import dicom_volume, import_dicom, read_series
from fedseg.data.importers.dicom_seg import read_seg, write_seg
from fedseg.errors import ConfigError, DataError
from fedseg.evaluation import argmax_segment
from fedseg.inference import ModelInfo, SiteModel, predict_files

CLASSES = ["background", "soft", "bone"]


class Bands(nn.Module):
    """Class 1 where the scaled intensity lies in [0.25, 0.75), class 2 above: a fixed model
    whose label map is known exactly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([(x < 0.25).float(), ((x >= 0.25) & (x < 0.75)).float(), x >= 0.75], 1)


def model(ndim: int, shape: tuple[int, ...]) -> SiteModel:
    info = ModelInfo(
        method="fixed",
        site="A",
        class_names=CLASSES,
        channels=1,
        ndim=ndim,
        spatial_shape=shape,
        ignore_index=255,
        regions={"soft": [1], "bone": [2]},
        modality="CT",
    )
    return SiteModel(Bands(), argmax_segment, info)


def scan(folder: Path) -> np.ndarray:
    """A CT series of -1000 (air), 0 (soft tissue, a box) and 1000 HU (bone, inside)."""
    hu = np.full((5, 12, 10), -1000, np.int16)
    hu[1:4, 2:10, 2:8] = 0
    hu[2, 5:7, 4:6] = 1000
    ct_series(folder, hu)
    return hu


def test_write_seg_round_trips_a_label_map(tmp_path: Path) -> None:
    hu = scan(tmp_path / "s")
    (series,) = read_series(tmp_path / "s")
    labels = np.digitize(hu, [-500, 500]).astype(np.uint8)  # 0, 1, 2
    path = write_seg(labels, series, CLASSES, tmp_path / "seg.dcm")
    seg = hd.seg.segread(path)
    assert [seg.get_segment_description(k).segment_label for k in (1, 2)] == CLASSES[1:]
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == series.uid
    assert np.array_equal(read_seg(path, series, {1: 1, 2: 2}), labels)
    with pytest.raises(DataError, match="do not lie on the grid"):
        write_seg(labels[1:], series, CLASSES, tmp_path / "bad.dcm")


@pytest.mark.parametrize(("ndim", "shape"), [(2, (10, 12)), (3, (4, 8, 8))])
def test_predicted_seg_is_read_back_by_import_dicom_as_the_predicted_mask(
    tmp_path: Path, ndim: int, shape: tuple[int, ...]
) -> None:
    site = tmp_path / "src" / "A"
    scan(site)
    window = (-1000.0, 1000.0)
    out = tmp_path / "pred"
    written = predict_files(
        model(ndim, shape), site, out, output_format="dicom-seg", ct_window=window, axis=2
    )
    (series,) = read_series(site)
    assert [p.name for p in written] == [f"{series.name.split()[1]}.dcm"]
    # what the model gives on the volume as import-dicom prepares it, on the DICOM grid
    volume, _, _ = dicom_volume(series, 2, window)
    expected = np.digitize(volume, [0.25, 0.75])
    seg = hd.seg.segread(written[0])
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == series.uid
    assert seg.number_of_segments == 2
    # the SEG beside its series imports as the predicted mask
    written[0].rename(site / "prediction.dcm")
    import_dicom(
        tmp_path / "src",
        tmp_path / "fed",
        class_names=CLASSES,
        mode="3d",
        shape=volume.shape,
        ct_window=window,
        test_fraction=0,
        segments={"soft": "soft", "bone": "bone"},
    )
    (sample,) = (dict(np.load(p)) for p in (tmp_path / "fed").rglob("*.npz"))
    assert np.array_equal(sample["mask"], expected)
    assert np.array_equal(sample["mask"] > 0, sample["image"][0] >= 0.25)
    assert set(np.unique(expected)) == {0, 1, 2}


def test_a_folder_without_dicom_series_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("no images")
    with pytest.raises(DataError, match="no DICOM image series"):
        predict_files(model(2, (8, 8)), tmp_path / "in", tmp_path / "o", output_format="dicom-seg")


def test_spacing_predicts_at_the_import_spacing_and_returns_to_the_series_grid(
    tmp_path: Path,
) -> None:
    hu = np.full((4, 12, 12), -1000, np.int16)
    hu[:, 2:10, 2:10] = 0  # soft tissue on even voxel boundaries: exact at half resolution
    hu[:, 5, 2:10] = 600  # a one-voxel line of bone, which 1.6 mm pixels blur away
    ct_series(tmp_path / "s", hu)  # 3 x 0.8 x 0.8 mm
    window = (-1000.0, 1000.0)
    sm = model(3, (4, 6, 6))
    native = predict_files(
        sm, tmp_path / "s", tmp_path / "a", output_format="dicom-seg", ct_window=window
    )
    coarse = predict_files(
        sm,
        tmp_path / "s",
        tmp_path / "b",
        output_format="dicom-seg",
        ct_window=window,
        spacing=(3.0, 1.6, 1.6),
    )
    (series,) = read_series(tmp_path / "s")
    at_native = read_seg(native[0], series, {1: 1, 2: 2})
    at_coarse = read_seg(coarse[0], series, {1: 1, 2: 2})
    expected = np.digitize((hu + 1000) / 2000, [0.25, 0.75])
    assert np.array_equal(at_native, expected)
    expected[:, 5, 2:10] = 1  # (600 + 0) / 2 HU: soft tissue at 1.6 mm
    assert at_coarse.shape == series.shape and np.array_equal(at_coarse, expected)
    with pytest.raises(ConfigError, match="--spacing needs 3 positive values"):
        predict_files(sm, tmp_path / "s", tmp_path / "c", spacing=(1.0, 1.0))


def test_a_series_highdicom_cannot_reference_is_refused_in_one_line(tmp_path: Path) -> None:
    hu = scan(tmp_path / "s")
    (series,) = read_series(tmp_path / "s")
    for header in series.headers:  # a type 2 attribute every CT image has, here dropped
        del header.PatientBirthDate
    with pytest.raises(DataError, match=r"no DICOM-SEG can be written on series .*PatientBirth"):
        write_seg(np.zeros(hu.shape, np.uint8), series, CLASSES, tmp_path / "seg.dcm")
