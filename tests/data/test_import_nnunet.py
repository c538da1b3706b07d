"""``fedseg data import-nnunet`` on tiny nnU-Net v2 and MSD datasets written with nibabel."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data import FederatedDataset, check_federation
from fedseg.data.importers.nnunet import import_nnunet
from fedseg.errors import DataError

N = 16


def phantom(case: int) -> np.ndarray:
    """Label volume (x, y, z): a cube of class 1 holding a smaller cube of class 2."""
    label = np.zeros((N, N, N), np.uint8)
    r = 4 + case % 2
    label[8 - r : 8 + r, 8 - r : 8 + r, 3:13] = 1
    label[7:9, 7:9, 6:10] = 2
    return label


def save(path: Path, data: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, np.diag([1.0, 1.0, 2.0, 1.0])), path)  # RAS already


def nnunet_dataset(root: Path, number: int, name: str, cases: int = 3) -> Path:
    """Channels CT (-500 outside, 200 inside the organ) and T2 (noise + organ), labels 0..2."""
    folder = root / f"Dataset{number:03d}_{name}"
    rng = np.random.default_rng(number)
    for c in range(cases):
        label = phantom(c)
        ct = np.where(label > 0, 200.0, -500.0).astype(np.float32)
        t2 = (rng.normal(50, 5, label.shape) + 100 * (label > 0)).astype(np.float32)
        case = f"{name.lower()}_{c:03d}"
        save(folder / "imagesTr" / f"{case}_0000.nii.gz", ct)
        save(folder / "imagesTr" / f"{case}_0001.nii.gz", t2)
        save(folder / "labelsTr" / f"{case}.nii.gz", label)
    meta = {
        "channel_names": {"0": "CT", "1": "T2"},
        "labels": {"background": 0, "liver": 1, "tumour": 2},
        "numTraining": cases,
        "file_ending": ".nii.gz",
    }
    (folder / "dataset.json").write_text(json.dumps(meta))
    return folder


def msd_task(root: Path, cases: int = 3) -> Path:
    """MSD layout: 4D (x, y, z, 2) images; channel 1 = 10 - channel 0; labels 0..1."""
    folder = root / "Task01_Tumour"
    training = []
    for c in range(cases):
        label = (phantom(c) > 0).astype(np.uint8)
        flair = 1.0 + 5.0 * label + 0.1 * c
        save(folder / "imagesTr" / f"site{c % 2}_{c}.nii.gz", np.stack([flair, 10 - flair], -1))
        save(folder / "labelsTr" / f"site{c % 2}_{c}.nii.gz", label)
        training.append(
            {
                "image": f"./imagesTr/site{c % 2}_{c}.nii.gz",
                "label": f"./labelsTr/site{c % 2}_{c}.nii.gz",
            }
        )
    meta = {
        "modality": {"0": "FLAIR", "1": "T1w"},
        "labels": {"0": "background", "1": "tumour"},
        "training": training,
        "test": [],
    }
    (folder / "dataset.json").write_text(json.dumps(meta))
    return folder


def cli(*args: str | Path) -> tuple[int, str]:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert "Traceback" not in out.output, out.output
    return out.exit_code, out.output


def all_splits(fed: FederatedDataset, site: str) -> tuple[np.ndarray, np.ndarray]:
    parts = [fed.load(site, s) for s in ("train", "val", "test")]
    parts = [p for p in parts if len(p.ids)]
    return np.concatenate([p.images for p in parts]), np.concatenate([p.masks for p in parts])


def test_nnunet_datasets_as_sites_3d_with_ct_window_and_zscore(tmp_path: Path) -> None:
    sources = [nnunet_dataset(tmp_path, 1, "SiteA"), nnunet_dataset(tmp_path, 2, "SiteB")]
    code, text = cli(
        "data", "import-nnunet", *sources, "--out", tmp_path / "fed", "--mode", "3d",
        "--shape", "16", "--ct-window=-200,300", "--normalize", "zscore", "--test-fraction", "0.34",
    )  # fmt: skip
    assert code == 0, text
    code, text = cli("data", "check", tmp_path / "fed")
    assert code == 0 and "no problems" in text, text
    fed = FederatedDataset.open(tmp_path / "fed")
    m = fed.manifest
    assert fed.site_names == ["SiteA", "SiteB"]
    assert m.class_names == ["background", "liver", "tumour"] and m.channels == 2
    for site in m.sites:
        assert (site.splits["train"], site.splits["test"]) == (2, 1)
    images, masks = all_splits(fed, "SiteA")
    assert images.shape == (3, 2, 16, 16, 16) and masks.shape == (3, 16, 16, 16)
    ct, t2 = images[:, 0], images[:, 1]
    np.testing.assert_allclose(ct[masks > 0], 0.8, atol=1e-5)  # (200 + 200) / 500
    np.testing.assert_allclose(ct[masks == 0], 0.0, atol=1e-5)  # -500 clipped to -200
    np.testing.assert_allclose(t2.mean(axis=(1, 2, 3)), 0, atol=1e-4)  # z-score per case
    np.testing.assert_allclose(t2.std(axis=(1, 2, 3)), 1, atol=1e-3)
    # labels kept, volume axes (x, y, z) -> (z, x, y) for the default axis 2
    expected = {np.transpose(phantom(c), (2, 0, 1)).tobytes() for c in range(3)}
    assert {m.astype(np.uint8).tobytes() for m in masks} <= expected
    assert set(np.unique(masks).tolist()) == {0, 1, 2}


def test_msd_4d_channels_as_2d_slices_with_sites_from_a_regex(tmp_path: Path) -> None:
    result = import_nnunet(
        [msd_task(tmp_path)],
        tmp_path / "fed",
        mode="2d",
        shape=(8, 8),
        site_regex=r"^(?P<site>site\d)_",
        test_fraction=0.0,
    )
    assert [s.name for s in result.manifest.sites] == ["site0", "site1"]
    assert result.dropped_slices == 3 * (16 - 10)  # the organ spans z = 3..12
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    assert fed.manifest.class_names == ["background", "tumour"] and fed.manifest.channels == 2
    site0 = fed.load("site0", "train")
    assert site0.images.shape == (20, 2, 8, 8)  # cases 0 and 2, 10 slices each
    ch0, ch1 = site0.images[:, 0], site0.images[:, 1]
    assert ch0[site0.masks == 1].mean() > 0.9 and ch0[site0.masks == 0].mean() < 0.1
    assert ch1[site0.masks == 1].mean() < 0.1 and ch1[site0.masks == 0].mean() > 0.9
    assert {i.rsplit("_", 1)[0] for i in site0.ids} == {"site0_0", "site0_2"}


def test_sites_from_a_csv_across_datasets(tmp_path: Path) -> None:
    sources = [nnunet_dataset(tmp_path, 1, "One"), nnunet_dataset(tmp_path, 2, "Two")]
    table = tmp_path / "sites.csv"
    table.write_text("case,site\n" + "".join(
        f"{d}_{c:03d},{'X' if c < 2 else 'Y'}\n" for d in ("one", "two") for c in range(3)
    ))  # fmt: skip
    result = import_nnunet(
        sources, tmp_path / "fed", mode="3d", shape=(8, 8, 8), site_csv=table, test_fraction=0
    )
    sizes = {s.name: s.splits["train"] for s in result.manifest.sites}
    assert sizes == {"X": 4, "Y": 2}
    table.write_text("case,site\none_000,X\n")
    with pytest.raises(DataError, match="case 'one_001' has no site in the site CSV"):
        import_nnunet(sources, tmp_path / "fed2", mode="3d", shape=(8, 8, 8), site_csv=table)


def _break_json(d: Path) -> None:
    (d / "dataset.json").write_text('{"channel_names": {"0": "CT"')


def _regions(d: Path) -> None:
    meta = json.loads((d / "dataset.json").read_text())
    meta["labels"] = {"background": 0, "whole": [1, 2], "core": 2}
    meta["regions_class_order"] = [1, 2]
    (d / "dataset.json").write_text(json.dumps(meta))


BROKEN = {
    "broken json": (_break_json, "dataset.json: not readable JSON"),
    "region labels": (_regions, "region-based"),
    "missing channel": (
        lambda d: (d / "imagesTr" / "a_001_0001.nii.gz").unlink(),
        "a_001_0001.nii.gz: missing",
    ),
    "channel shape": (
        lambda d: save(d / "imagesTr" / "a_001_0001.nii.gz", np.zeros((16, 16, 12), np.float32)),
        "a_001_0001.nii.gz: channel shape (16, 16, 12) differs",
    ),
    "label shape": (
        lambda d: save(d / "labelsTr" / "a_002.nii.gz", np.zeros((16, 16, 12), np.uint8)),
        "a_002.nii.gz: label shape (16, 16, 12) differs",
    ),
    "label outside list": (
        lambda d: save(d / "labelsTr" / "a_000.nii.gz", phantom(0) * 2),
        "a_000.nii.gz: label values must be the integers 0..2 listed in dataset.json 'labels', "
        "got [4]",
    ),
    "shared label value": (
        lambda d: (d / "dataset.json").write_text(
            '{"channel_names": {"0": "CT", "1": "T2"}, "labels": {"bg": 0, "a": 1, "b": 1}}'
        ),
        "'labels' 'a' and 'b' share 1",
    ),
    "no channel names": (
        lambda d: (d / "dataset.json").write_text('{"channel_names": [], "labels": {}}'),
        "'channel_names' must be an object",
    ),
}


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_broken_dataset_is_refused_in_one_line_naming_the_file(tmp_path: Path, how: str) -> None:
    folder = nnunet_dataset(tmp_path, 7, "A")
    breaker, message = BROKEN[how]
    breaker(folder)
    code, text = cli("data", "import-nnunet", folder, "--out", tmp_path / "fed", "--mode", "3d",
                     "--shape", "8")  # fmt: skip
    assert code != 0
    assert any(message in line for line in text.splitlines()), text
    assert not (tmp_path / "fed").exists()  # nothing half-written


def test_option_errors(tmp_path: Path) -> None:
    task = msd_task(tmp_path)
    with pytest.raises(DataError, match="needs a channel named CT"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8), ct_window=(-100, 100))
    with pytest.raises(DataError, match="ct_window must be LOW,HIGH with LOW < HIGH"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8), ct_window=(100, -100))
    with pytest.raises(DataError, match="normalization must be one of"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8), normalization="robust")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="case 'site0_0' has no site in the site regex"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8), site_regex=r"^(x)")
    a, b = nnunet_dataset(tmp_path, 1, "A"), msd_task(tmp_path / "m")
    with pytest.raises(DataError, match="datasets must agree"):
        import_nnunet([a, b], tmp_path / "f", mode="2d", shape=(8, 8))


def test_msd_errors_name_the_entry(tmp_path: Path) -> None:
    task = msd_task(tmp_path)
    meta = json.loads((task / "dataset.json").read_text())
    (task / "labelsTr" / "site1_1.nii.gz").unlink()
    with pytest.raises(DataError, match=r"site1_1.nii.gz: missing \(listed in .*'training'\[1\]"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8))
    meta["training"][1] = {"image": "./imagesTr/site1_1.nii.gz"}
    (task / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"'training'\[1\] must have 'image' and 'label' paths"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8))
    meta["modality"] = {"0": "FLAIR"}
    meta["training"] = meta["training"][:1]
    (task / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"site0_0\.nii\.gz: 2 channels, dataset\.json lists 1"):
        import_nnunet([task], tmp_path / "f", mode="2d", shape=(8, 8))
    assert not (tmp_path / "f").exists()
