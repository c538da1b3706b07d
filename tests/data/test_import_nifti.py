"""``fedseg data import-nifti``: CT windows, one spacing for the federation, suffix matching."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data import FederatedDataset, check_federation
from fedseg.data.importers import import_nifti
from fedseg.errors import DataError


def cli(*args: str | Path) -> tuple[int, str]:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert "Traceback" not in out.output, out.output
    return out.exit_code, out.output


def organ(voxel: float, fov_mm: float = 48.0, side_mm: float = 16.0, depth: int = 4) -> np.ndarray:
    """Label volume (x, y, z) of a ``fov_mm`` field of view at ``voxel`` mm in-plane: a
    ``side_mm`` square organ (class 1) in slices 1..depth-2 of ``depth``."""
    n, k = round(fov_mm / voxel), round(side_mm / voxel)
    label = np.zeros((n, n, depth), np.uint8)
    lo = (n - k) // 2
    label[lo : lo + k, lo : lo + k, 1 : depth - 1] = 1
    return label


def save(path: Path, data: np.ndarray, affine: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), path)


def ct_site(root: Path, site: str, voxel: float, cases: int = 2, suffix: str = "_seg") -> None:
    """CT cases in HU (air -1000 outside the body disc, fat -100, organ 60, bone 700) side
    by side with their labels, ``voxel`` mm in-plane, 3 mm slices."""
    affine = np.diag([voxel, voxel, 3.0, 1.0])
    for c in range(cases):
        label = organ(voxel)
        image = np.full(label.shape, -100.0, np.float32)
        n = label.shape[0]
        x, y = np.mgrid[:n, :n]
        image[(x - n / 2) ** 2 + (y - n / 2) ** 2 > (n / 2) ** 2] = -1000
        image[label == 1] = 60
        bone = round(4 / voxel)  # a 4 mm bone block in a corner
        image[:bone, :bone] = 700
        save(root / site / f"case{c}.nii.gz", image, affine)
        save(root / site / f"case{c}{suffix}.nii.gz", label, affine)


def test_ct_window_and_one_spacing_for_sites_with_other_voxel_sizes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ct_site(src, "fine", voxel=0.5)  # 96 x 96 px over 48 mm
    ct_site(src, "coarse", voxel=2.0)  # 24 x 24 px over the same 48 mm
    code, text = cli(
        "data", "import-nifti", src, tmp_path / "fed", "--classes", "background,organ",
        "--modality", "CT", "--ct-window=-160,240", "--spacing", "1", "--shape", "56",
        "--mask-suffix", "_seg", "--test-fraction", "0",
    )  # fmt: skip
    assert code == 0, text
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    assert fed.manifest.modality == "CT" and fed.site_names == ["coarse", "fine"]
    for site in fed.site_names:
        split = fed.load(site, "train")
        assert split.images.shape == (4, 1, 56, 56)  # 2 cases x 2 organ slices
        np.testing.assert_allclose(split.spacing, 1.0)
        # the 16 mm organ is 16 x 16 px at both sites: one physical scale for the federation
        assert [int(m.sum()) for m in split.masks] == [256] * 4
        grey, masks = split.images[:, 0].numpy(), split.masks.numpy()
        inner = ndimage.binary_erosion(masks == 1, np.ones((1, 3, 3)))  # edges blend linearly
        np.testing.assert_allclose(grey[inner], (60 + 160) / 400, atol=1e-5)
        assert grey.min() == 0.0 and grey.max() == pytest.approx(1.0)  # air and bone clipped
        # 48 mm field of view centre-padded into 56 mm: 4 px of padding on each side
        assert np.all(grey[:, :4] == 0) and np.all(grey[:, 4:52, 4:52].max(axis=(1, 2)) > 0)


def test_resizing_scales_with_the_field_of_view_and_one_spacing_does_not(tmp_path: Path) -> None:
    small = tmp_path / "small"
    for site, fov in (("a", 48.0), ("b", 24.0)):
        label = organ(1.0, fov_mm=fov, side_mm=8.0)
        save(small / site / "c.nii.gz", label.astype(np.float32) * 100, np.diag([1, 1, 3, 1.0]))
        save(small / site / "c_seg.nii.gz", label, np.diag([1, 1, 3, 1.0]))
    kw = {"class_names": ["bg", "organ"], "mode": "2d", "shape": (48, 48),
          "mask_suffix": "_seg", "test_fraction": 0}  # fmt: skip
    import_nifti(small, tmp_path / "resized", **kw)
    import_nifti(small, tmp_path / "resampled", spacing=(1.0, 1.0), **kw)
    area = lambda root, s: int(FederatedDataset.open(root).load(s, "train").masks[0].sum())  # noqa: E731
    assert (area(tmp_path / "resized", "a"), area(tmp_path / "resized", "b")) == (64, 256)
    assert (area(tmp_path / "resampled", "a"), area(tmp_path / "resampled", "b")) == (64, 64)


def test_3d_spacing_resamples_every_axis_from_the_affine(tmp_path: Path) -> None:
    src = tmp_path / "src"
    label = np.zeros((10, 8, 6), np.uint8)  # (x, y, z) stored with x flipped and z at 4 mm
    label[2:6, 2:6, 1:4] = 1
    affine = np.diag([-1.5, 2.0, 4.0, 1.0])
    save(src / "A" / "images" / "c.nii.gz", label.astype(np.float32), affine)
    save(src / "A" / "labels" / "c.nii.gz", label, affine)
    result = import_nifti(
        src, tmp_path / "fed", class_names=["bg", "organ"], mode="3d", shape=(32, 24, 24),
        spacing=(0.5, 1.0, 1.0), test_fraction=0, interpolation="cubic",
    )  # fmt: skip
    assert result.manifest.spatial_shape == (32, 24, 24)
    split = FederatedDataset.open(tmp_path / "fed").load("A", "train")
    np.testing.assert_allclose(split.spacing[0], (0.5, 1.0, 1.0))
    mask = split.masks[0].numpy()
    # (D, H, W) = z, x, y: 3 slices x 4 mm = 24 voxels, 4 x 1.5 mm = 6, 4 x 2 mm = 8
    extent = [int(np.any(mask, axis=tuple(a for a in range(3) if a != k)).sum()) for k in range(3)]
    assert extent == [24, 6, 8]


def test_mask_suffix_matches_any_case_and_near_misses_are_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ct_site(src, "A", voxel=2.0, cases=1, suffix="_Segmentation")
    result = import_nifti(
        src, tmp_path / "fed", class_names=["bg", "organ"], mode="2d", shape=(24, 24),
        mask_suffix="_segmentation", modality="CT", ct_window=(-160, 240), test_fraction=0,
    )  # fmt: skip
    assert result.manifest.sites[0].splits["train"] == 2
    with pytest.raises(DataError, match=r"images without mask: \['case0'.*near matches: "
                       r"case0 ~ case0_Segmentation"):  # fmt: skip
        import_nifti(
            src, tmp_path / "f2", class_names=["bg", "organ"], mode="2d", shape=(24, 24),
            mask_suffix="_seg", modality="CT", ct_window=(-160, 240),
        )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"modality": "CT"}, "--modality CT needs --ct-window"),
        ({"ct_window": (-100, 100)}, "a CT window needs --modality CT"),
        ({"modality": "CT", "ct_window": (100, -100)}, "LOW < HIGH"),
        ({"spacing": (1.0,)}, "--spacing needs 2 positive values"),
        ({"spacing": (1.0, 1.0), "fit": "resize"}, "and --fit crop"),
        ({"spacing": (1.0, 0.0)}, "--spacing needs 2 positive values"),
        ({"spacing": (1.0, 1.0), "interpolation": "nearest"}, "--interpolation must be one of"),
    ],
)
def test_option_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    ct_site(tmp_path / "src", "A", voxel=2.0, cases=1)
    with pytest.raises(DataError, match=message):
        import_nifti(
            tmp_path / "src", tmp_path / "fed", class_names=["bg", "organ"], mode="2d",
            shape=(24, 24), mask_suffix="_seg", **kwargs,
        )  # fmt: skip
    assert not (tmp_path / "fed").exists()


def test_cli_refuses_a_malformed_window(tmp_path: Path) -> None:
    ct_site(tmp_path / "src", "A", voxel=2.0, cases=1)
    code, text = cli(
        "data", "import-nifti", tmp_path / "src", tmp_path / "fed", "--classes", "bg,organ",
        "--modality", "CT", "--ct-window", "lung", "--mask-suffix", "_seg",
    )  # fmt: skip
    assert code != 0 and "--ct-window must be comma-separated numbers, got 'lung'" in text
