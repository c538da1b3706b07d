"""``fedseg data import-dicom``: series geometry, SEG and RTSTRUCT masks, and every refusal,
on DICOM files written by the tests (pydicom/highdicom) and the real files pydicom ships."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.pixels import get_decoder
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from dicom_fixtures import box_contour, ct_series, rtstruct_file, seg_file
from fedseg.cli import app
from fedseg.data import FederatedDataset
from fedseg.data.importers.dicom import dicom_volume, import_dicom, read_series
from fedseg.data.importers.dicom_series import assemble, from_ras, to_ras
from fedseg.errors import DataError

CLASSES = ["background", "liver"]


def organ(depth: int = 6, rows: int = 16, cols: int = 14) -> np.ndarray:
    """HU volume: -500 around a box of 40 HU (slices 1..4, rows 4..9, columns 3..8)."""
    hu = np.full((depth, rows, cols), -500, np.int16)
    hu[1:5, 4:10, 3:9] = 40
    return hu


def seg_site(folder: Path, hu: np.ndarray, **kw) -> list[pydicom.Dataset]:
    series = ct_series(folder, hu, **kw)
    seg_file(folder / "seg" / "mask.dcm", series, (hu > 0).astype(np.uint8), ["Liver"])
    return series


def samples(root: Path) -> dict[str, dict[str, np.ndarray]]:
    return {p.stem: dict(np.load(p)) for p in sorted((root / "sites").rglob("*.npz"))}


def test_slices_are_ordered_by_position_along_the_normal_not_by_file(tmp_path: Path) -> None:
    hu = (np.arange(5 * 4 * 3).reshape(5, 4, 3) * 10).astype(np.int16)
    # slice k written at z = 40 - 3k: file order and InstanceNumber run against the geometry
    ct_series(tmp_path / "s", hu, positions=[(0, 0, 40 - 3 * k) for k in range(5)])
    (series,) = read_series(tmp_path / "s")
    assert np.array_equal(series.pixels(), hu[::-1])
    assert series.spacing == pytest.approx((3.0, 0.8, 0.8))
    # slices at z = 3k, but rows along -x make the normal -z: sorted along the normal, the
    # order reverses
    positions = [(0, 0, 3 * k) for k in range(5)]
    ct_series(tmp_path / "t", hu, orientation=(-1, 0, 0, 0, 1, 0), positions=positions)
    (flipped,) = read_series(tmp_path / "t")
    normal = np.cross([-1, 0, 0], [0, 1, 0])
    depth = [np.asarray(h.ImagePositionPatient, float) @ normal for h in flipped.headers]
    assert depth == sorted(depth) and np.array_equal(flipped.pixels(), hu[::-1])


@pytest.mark.parametrize(
    ("orientation", "expected", "zooms"),
    [
        # axial, rows along +x (L), columns down +y (P): RAS x and y run against them
        ((1, 0, 0, 0, 1, 0), lambda v: v.transpose(2, 1, 0)[::-1, ::-1, :], (0.7, 0.5, 2.0)),
        # rows along -x (R): x follows the columns; the normal is -z, so slices run downwards
        ((-1, 0, 0, 0, 1, 0), lambda v: v.transpose(2, 1, 0)[:, ::-1, ::-1], (0.7, 0.5, 2.0)),
        # coronal: columns along x (L), rows down -z (F); the normal is +y (P)
        ((1, 0, 0, 0, 0, -1), lambda v: v.transpose(2, 0, 1)[::-1, ::-1, ::-1], (0.7, 2.0, 0.5)),
    ],
)
def test_volumes_are_reoriented_to_ras_from_the_dicom_geometry(
    tmp_path: Path, orientation: tuple[int, ...], expected, zooms: tuple[float, ...]
) -> None:
    hu = (np.arange(4 * 5 * 6).reshape(4, 5, 6)).astype(np.int16)
    ct_series(tmp_path, hu, orientation=orientation, spacing=(2.0, 0.5, 0.7))
    (series,) = read_series(tmp_path)
    ras, found, ornt = to_ras(series.pixels(), series.affine)
    assert np.array_equal(ras, expected(hu)) and found == pytest.approx(zooms)
    assert np.array_equal(from_ras(ras, ornt), hu)


def test_ct_is_in_hounsfield_units_from_the_real_pydicom_ct_slice(tmp_path: Path) -> None:
    ct = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    series_uid = generate_uid()
    for k in range(3):  # the real slice three times, 5 mm apart
        ds = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
        ds.SeriesInstanceUID, ds.SOPInstanceUID = series_uid, generate_uid()
        ds.ImagePositionPatient = [*ct.ImagePositionPatient[:2], float(k * 5)]
        ds.save_as(tmp_path / f"x{k}.dcm")
    (series,) = read_series(tmp_path)
    hu = ct.pixel_array.astype(np.float32) * float(ct.RescaleSlope) + float(ct.RescaleIntercept)
    assert float(ct.RescaleIntercept) == -1024 and np.array_equal(series.pixels()[0], hu)
    assert series.spacing == pytest.approx((5.0, *map(float, ct.PixelSpacing)))
    image, spacing, _ = dicom_volume(series, 0, (-100.0, 300.0))  # axis 0: sagittal slices
    expected = np.clip((to_ras(series.pixels(), series.affine)[0] + 100) / 400, 0, 1)
    assert np.allclose(image, expected) and len(spacing) == 3


def test_the_real_mr_slice_reads_with_its_geometry(tmp_path: Path) -> None:
    shutil.copy(get_testdata_file("MR_small.dcm", download=False), tmp_path / "mr")
    (series,) = read_series(tmp_path)
    mr = pydicom.dcmread(tmp_path / "mr")
    assert series.modality == "MR" and series.shape == (1, 64, 64)
    assert series.spacing[1:] == pytest.approx([float(v) for v in mr.PixelSpacing])
    assert np.array_equal(series.pixels()[0], mr.pixel_array.astype(np.float32))


def test_seg_and_rtstruct_sites_import_with_their_masks(tmp_path: Path) -> None:
    hu = organ()
    seg_site(tmp_path / "src" / "A" / "p1", hu)
    series = ct_series(tmp_path / "src" / "B" / "p1", hu)
    ring = {  # a box with a hole on slice 2 (even-odd), a plain box elsewhere
        k: [box_contour(series[k], 4, 9, 3, 8)] + ([box_contour(series[k], 6, 7, 5, 6)] * (k == 2))
        for k in range(1, 5)
    }
    rtstruct_file(tmp_path / "src" / "B" / "rs.dcm", series, {"Liver": ring, "Body": {}})
    out = tmp_path / "fed"
    result = import_dicom(
        tmp_path / "src",
        out,
        class_names=CLASSES,
        mode="3d",
        shape=(6, 14, 16),
        axis=2,
        rois={"Body": "background"},
        test_fraction=0.0,
    )
    assert result.manifest.site_names == ["A", "B"] and result.manifest.modality == "CT"
    fed = samples(out)
    (a,) = (v for k, v in fed.items() if (out / "sites" / "A" / "train" / f"{k}.npz").exists())
    (b,) = (v for k, v in fed.items() if (out / "sites" / "B" / "train" / f"{k}.npz").exists())
    (sa,) = read_series(tmp_path / "src" / "A")
    expected = to_ras((hu > 0).astype(np.uint8), sa.affine)[0].transpose(2, 0, 1)
    assert np.array_equal(a["mask"], expected)
    hole = hu > 0
    hole[2, 6:8, 5:7] = False
    (sb,) = read_series(tmp_path / "src" / "B")
    assert np.array_equal(b["mask"], to_ras(hole.astype(np.uint8), sb.affine)[0].transpose(2, 0, 1))
    assert a["spacing"] == pytest.approx([3.0, 0.8, 0.8])


def test_nothing_identifying_leaves_and_the_manifest_holds_hashed_uids(tmp_path: Path) -> None:
    series = seg_site(tmp_path / "src" / "A", organ(), patient="Secret42")
    out = tmp_path / "fed"
    import_dicom(tmp_path / "src", out, class_names=CLASSES, shape=(16, 14), test_fraction=0)
    uid = str(series[0].SeriesInstanceUID)
    digest = hashlib.sha256(uid.encode()).hexdigest()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["series"] == {"A": [digest]}
    assert sorted(samples(out)) == [f"{digest[:12]}_{k:03d}" for k in range(1, 5)]
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (uid, "Secret42", str(series[0].StudyInstanceUID), "Doe^"):
                assert secret.encode() not in data, (path, secret)


def test_sites_by_tag_and_spacing_resampling(tmp_path: Path) -> None:
    src = tmp_path / "export"  # one flat PACS export, the site in InstitutionName
    seg_site(src / "a", organ(), institution="St Mary's")
    seg_site(src / "b", organ(), institution="General", spacing=(3.0, 0.4, 0.4))
    runner = CliRunner()
    args = ["data", "import-dicom", str(src), str(tmp_path / "fed"), "--classes", "bg,liver"]
    done = runner.invoke(
        app,
        [
            *args,
            "--site-tag",
            "InstitutionName",
            "--spacing",
            "0.8",
            "--shape",
            "20",
            "--test-fraction",
            "0",
        ],
    )
    assert done.exit_code == 0, done.output
    fed = FederatedDataset.open(tmp_path / "fed")
    assert fed.site_names == ["General", "St_Mary_s"]
    masks = {
        s: [dict(np.load(p)) for p in sorted((tmp_path / "fed" / "sites" / s).rglob("*.npz"))]
        for s in fed.site_names
    }
    # both sites now have 0.8 mm pixels: the 0.4 mm site's 6 x 6 box is 3 x 3 pixels
    for site in fed.site_names:
        for sample in masks[site]:
            assert sample["spacing"] == pytest.approx([0.8, 0.8])
            assert set(np.unique(sample["mask"])) <= {0, 1}
    assert masks["St_Mary_s"][0]["mask"].sum() == 36 and masks["General"][0]["mask"].sum() == 9


def test_unmapped_names_are_refused_with_the_names_found(tmp_path: Path) -> None:
    # the real RT Structure Set pydicom ships: its ROIs are mapped to no class
    site = tmp_path / "src" / "A"
    site.mkdir(parents=True)
    shutil.copy(get_testdata_file("rtstruct.dcm", download=False), site / "rs")
    with pytest.raises(DataError, match=r"ROI names \['Isocenter 1', 'Isocenter 2', 'patient'\]"):
        import_dicom(tmp_path / "src", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    # mapped, its referenced CT series (not shipped) is missing
    rois = {"patient": "liver", "Isocenter 1": "background", "Isocenter 2": "background"}
    with pytest.raises(DataError, match=r"referenced image series .* is absent"):
        import_dicom(tmp_path / "src", tmp_path / "o", class_names=CLASSES, shape=(8, 8), rois=rois)
    with pytest.raises(DataError, match="'kidney' is no class"):
        import_dicom(
            tmp_path / "src",
            tmp_path / "o",
            class_names=CLASSES,
            shape=(8, 8),
            segments={"x": "kidney"},
        )


def test_a_seg_whose_series_is_absent_is_refused_on_the_real_liver_seg(tmp_path: Path) -> None:
    seg_site(tmp_path / "src" / "A", organ())  # a complete site, and the real liver SEG
    shutil.copy(get_testdata_file("liver_1frame.dcm", download=False), tmp_path / "src" / "A")
    with pytest.raises(
        DataError,
        match=r"liver_1frame.dcm: its referenced image series "
        r"1\.2\.392\..* is absent",
    ):
        import_dicom(tmp_path / "src", tmp_path / "o", class_names=CLASSES, shape=(8, 8))


def test_missing_slices_and_uneven_spacing_are_refused(tmp_path: Path) -> None:
    hu = organ()
    gap = [(0, 0, z) for z in (0, 3, 6, 12, 15, 18)]  # z = 9 is missing
    seg_site(tmp_path / "gap" / "A", hu, positions=gap)
    with pytest.raises(DataError, match=r"missing slices: a gap of 6.00 mm .* 3.00 mm apart"):
        import_dicom(tmp_path / "gap", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    uneven = [(0, 0, z) for z in (0, 3, 6, 9, 11.5, 14.5)]
    seg_site(tmp_path / "uneven" / "A", hu, positions=uneven)
    with pytest.raises(DataError, match=r"inconsistent spacing: slice steps range from 2\.500"):
        import_dicom(tmp_path / "uneven", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    series = ct_series(tmp_path / "pix" / "A", hu)
    odd = next((tmp_path / "pix" / "A").glob("*.dcm"))
    bad = pydicom.dcmread(odd)
    bad.PixelSpacing = [0.9, 0.9]
    bad.save_as(odd)
    seg_file(tmp_path / "pix" / "A" / "seg", series, (hu > 0).astype(np.uint8), ["liver"])
    with pytest.raises(DataError, match=rf"{odd.name}: inconsistent spacing: PixelSpacing \[0.9"):
        import_dicom(tmp_path / "pix", tmp_path / "o", class_names=CLASSES, shape=(8, 8))


@pytest.mark.parametrize("where", [0, 2, 5])
def test_the_odd_slice_is_named_whatever_the_file_order(tmp_path: Path, where: int) -> None:
    """The slice whose grid differs from the others' is the one refused, first read or last."""
    ct_series(tmp_path / "A", organ())
    slices = [(f, pydicom.dcmread(f)) for f in sorted((tmp_path / "A").glob("*.dcm"))]
    slices[where][1].PixelSpacing = [0.9, 0.9]
    odd = slices[where][0].name
    with pytest.raises(DataError, match=rf"{odd}: inconsistent spacing: PixelSpacing \[0.9"):
        assemble("1.2.3", slices)
    slices[where][1].Rows = 12
    with pytest.raises(DataError, match=rf"{odd}: 12 x 14 pixels, other slices .* 16 x 14"):
        assemble("1.2.3", slices)


def test_a_mask_grid_that_does_not_match_its_image_is_refused(tmp_path: Path) -> None:
    hu = organ()
    drawn_on = ct_series(tmp_path / "elsewhere", hu)
    uid = str(drawn_on[0].SeriesInstanceUID)
    ct_series(tmp_path / "src" / "A", organ(rows=12), series_uid=uid)  # same series, 12 rows
    seg_file(tmp_path / "src" / "A" / "seg", drawn_on, (hu > 0).astype(np.uint8), ["liver"])
    with pytest.raises(DataError, match=r"mask grid does not match its image .*16 x 14 pixels"):
        import_dicom(tmp_path / "src", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    # a SEG drawn on the series turned in-plane
    turned = ct_series(tmp_path / "turned", hu, orientation=(-1, 0, 0, 0, 1, 0))
    uid = str(turned[0].SeriesInstanceUID)
    ct_series(tmp_path / "src2" / "A", hu, series_uid=uid)
    seg_file(tmp_path / "src2" / "A" / "seg", turned, (hu > 0).astype(np.uint8), ["liver"])
    with pytest.raises(DataError, match=r"mask grid does not match .*another ImageOrientation"):
        import_dicom(tmp_path / "src2", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    # an RTSTRUCT contour half-way between two slices lies on none of them
    series = ct_series(tmp_path / "rt" / "A", hu)
    contour = box_contour(series[1], 4, 9, 3, 8)
    contour[2::3] = [z + 1.5 for z in contour[2::3]]
    rtstruct_file(tmp_path / "rt" / "A" / "rs", series, {"liver": {1: [contour]}})
    with pytest.raises(DataError, match=r"mask grid does not match .* slice index 1.50"):
        import_dicom(tmp_path / "rt", tmp_path / "o", class_names=CLASSES, shape=(8, 8))


def test_compressed_pixel_data_without_its_decoder_names_the_package(tmp_path: Path) -> None:
    path = get_testdata_file("SC_rgb_jpeg_gdcm.dcm", download=False)  # JPEG Lossless, SV1
    syntax = pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID
    if get_decoder(syntax).is_available:
        pytest.skip(f"a decoder of {syntax.name} is installed here")
    (tmp_path / "src" / "A").mkdir(parents=True)
    shutil.copy(path, tmp_path / "src" / "A" / "image")
    with pytest.raises(DataError, match=r"JPEG Lossless.* no decoder .* pylibjpeg"):
        import_dicom(tmp_path / "src", tmp_path / "o", class_names=CLASSES, shape=(8, 8))


def test_without_pydicom_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("fedseg.data.importers.dicom")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pydicom", None)
    with pytest.raises(DataError, match=r"pip install 'fedseg\[dicom\]'"):
        import fedseg.data.importers.dicom  # noqa: F401


def test_multi_frame_images_shared_positions_and_two_masks_are_refused(tmp_path: Path) -> None:
    site = tmp_path / "mf" / "A"
    site.mkdir(parents=True)
    shutil.copy(get_testdata_file("SC_rgb_rle_2frame.dcm", download=False), site / "x")
    with pytest.raises(DataError, match="a multi-frame OT image"):
        import_dicom(tmp_path / "mf", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    hu = organ()
    twice = [(0, 0, z) for z in (0, 3, 3, 6, 9, 12)]
    series = ct_series(tmp_path / "dup" / "A", hu, positions=twice)
    rtstruct_file(tmp_path / "dup" / "A" / "rs", series, {"liver": {}})
    with pytest.raises(DataError, match=r"lie at the same position \(3.00 mm"):
        import_dicom(tmp_path / "dup", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
    series = seg_site(tmp_path / "two" / "A", hu)
    seg_file(tmp_path / "two" / "A" / "again", series, (hu > 0).astype(np.uint8), ["liver"])
    with pytest.raises(DataError, match="are both masks of one image series; keep one"):
        import_dicom(tmp_path / "two", tmp_path / "o", class_names=CLASSES, shape=(8, 8))
