"""Importers on small files written in the public layouts: h5, image folders, NIfTI."""

from __future__ import annotations

from pathlib import Path

import cv2
import h5py
import nibabel as nib
import numpy as np
import pytest

from fedseg.data import FederatedDataset, check_federation
from fedseg.data.importers import import_folder, import_h5, import_nifti
from fedseg.errors import DataError


def disc(size: int, r: float, value: int = 1) -> np.ndarray:
    yy, xx = np.indices((size, size))
    return (((yy - size / 2) ** 2 + (xx - size / 2) ** 2 <= r * r) * value).astype(np.uint8)


# ---------------------------------------------------------------- h5 (FedLPPA authors' layout)
def write_h5(src: Path, site: str, split: str, n: int, weak: bool) -> None:
    folder = src / site / split
    folder.mkdir(parents=True)
    for i in range(n):
        mask = disc(16, 4 + i % 3)
        with h5py.File(folder / f"case{i}.h5", "w") as f:
            f["image"] = mask.astype(np.float32) * 0.8 + 0.1
            f["mask"] = mask
            if weak:
                unlabeled = np.full_like(mask, 2)  # num_classes = 2 marks unlabeled pixels
                unlabeled[8, 8], unlabeled[0, 0] = 1, 0
                f["scribble"] = unlabeled
                f["keypoint"] = unlabeled
                f["block"] = mask


@pytest.fixture
def h5_src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for site in ("Domain1", "Domain2", "Domain10"):
        write_h5(src, site, "train", 6, weak=True)
        write_h5(src, site, "test", 2, weak=False)
    return src


def test_import_h5(h5_src: Path, tmp_path: Path) -> None:
    m = import_h5(
        h5_src,
        tmp_path / "fed",
        class_names=["bg", "fg"],
        annotations={"Domain1": "scribble"},
        weak_keys={"Domain2": "keypoint"},
        val_fraction=0.34,
        seed=0,
    )
    assert m.site_names == ["Domain1", "Domain2", "Domain10"]
    assert [s.annotation for s in m.sites] == ["scribble", "point", "full"]
    assert m.sites[0].splits == {"train": 4, "val": 2, "test": 2}
    assert m.weak_labels is not None and m.weak_labels.origin == "imported:h5"
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed, labels="weak") == []
    weak = fed.load("Domain2", "train", "weak")
    assert weak.images.shape == (4, 1, 16, 16)
    assert set(weak.labels.unique().tolist()) == {0, 1, 255}
    assert (weak.labels == 255).sum() == 4 * (256 - 2)
    with pytest.raises(DataError, match=r"weak label missing"):
        fed.load("Domain1", "test", "weak")  # the authors' test files carry no weak labels


def test_import_h5_errors(h5_src: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing keys \['box'\]; it has"):
        import_h5(h5_src, tmp_path / "a", class_names=["bg", "fg"], annotations={"Domain1": "box"})
    with pytest.raises(DataError, match=r"--weak-key values must be in"):
        import_h5(h5_src, tmp_path / "b", class_names=["bg", "fg"], weak_keys={"Domain1": "x"})
    with pytest.raises(DataError, match=r"unknown sites \['Domain9'\]"):
        import_h5(
            h5_src, tmp_path / "c", class_names=["bg", "fg"], annotations={"Domain9": "point"}
        )
    with h5py.File(h5_src / "Domain2" / "train" / "case3.h5", "r+") as f:
        f["scribble"][0, 0] = 7
    with pytest.raises(DataError, match=r"case3.h5: scribble values must be classes 0..1 or the"):
        import_h5(
            h5_src, tmp_path / "d", class_names=["bg", "fg"], annotations={"Domain2": "scribble"}
        )


# ---------------------------------------------------------------- image folders (PNG/JPG)
def write_fundus_site(folder: Path, n: int, ext: str, drift: int = 0) -> None:
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    for i in range(n):
        grey = disc(40, 14, 128) + disc(40, 6, 127)  # rim 128, cup 255
        grey = np.where(grey > 0, grey, 0).astype(np.int64)
        grey = np.clip(grey - drift * (grey == 255) + drift * (grey == 128), 0, 255)
        cv2.imwrite(str(folder / "masks" / f"img{i}.png"), grey.astype(np.uint8))
        image = np.dstack([grey // 2, grey // 3, grey // 4]).astype(np.uint8) + 20
        cv2.imwrite(str(folder / "images" / f"img{i}{ext}"), image)


def test_import_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_fundus_site(src / "refuge", 5, ".png")
    write_fundus_site(src / "drishti" / "train", 4, ".jpg", drift=3)
    write_fundus_site(src / "drishti" / "test", 2, ".jpg", drift=3)
    m = import_folder(
        src,
        tmp_path / "fed",
        class_names=["background", "cup", "rim"],
        mapping={0: 0, 255: 1, 128: 2},
        size=(24, 24),
        tolerance=4,
        test_fraction=0.2,
        val_fraction=0.25,
        seed=0,
        regions={"cup": [1], "disc": [1, 2]},
        annotations={"refuge": "box"},
    )
    assert m.site_names == ["drishti", "refuge"]
    assert m.sites[0].splits == {"train": 3, "val": 1, "test": 2}
    assert m.sites[1].splits == {"train": 3, "val": 1, "test": 1}
    assert m.regions["disc"] == [1, 2] and m.sites[1].annotation == "box"
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    split = fed.load("drishti", "test")
    assert split.images.shape == (2, 3, 24, 24)
    assert split.images.min() >= 0 and split.images.max() <= 1
    assert set(split.masks.unique().tolist()) == {0, 1, 2}
    cup = split.masks == 1
    assert split.images[:, 0][cup].mean() > split.images[:, 0][split.masks == 2].mean()


def test_import_folder_refuses_unknown_levels_and_unpaired_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_fundus_site(src / "a", 3, ".png", drift=3)
    with pytest.raises(DataError, match=r"img0.png: values \[131, 252\] are not within 0"):
        import_folder(
            src,
            tmp_path / "x",
            class_names=["bg", "cup", "rim"],
            mapping={0: 0, 255: 1, 128: 2},
            size=(24, 24),
        )
    (src / "a" / "masks" / "img0.png").unlink()
    with pytest.raises(DataError, match=r"images without mask: \['img0'\]"):
        import_folder(
            src,
            tmp_path / "y",
            class_names=["bg", "cup", "rim"],
            mapping={0: 0, 255: 1, 128: 2},
            size=(24, 24),
            tolerance=4,
        )


# ---------------------------------------------------------------- NIfTI volumes
def write_case(folder: Path, name: str, seed: int, suffix: str = "") -> None:
    rng = np.random.default_rng(seed)
    label = np.zeros((20, 24, 10), np.uint8)
    label[6:14, 8:16, 3:7] = 255  # present in slices 3..6 of the last axis only
    image = rng.normal(100, 5, label.shape) + 200 * (label > 0)
    affine = np.diag([1.5, 2.0, 3.0, 1.0])
    images = folder if suffix else folder / "images"
    labels = folder if suffix else folder / "labels"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(image.astype(np.float32), affine), images / f"{name}.nii.gz")
    nib.save(nib.Nifti1Image(label, affine), labels / f"{name}{suffix}.nii.gz")


@pytest.fixture
def nifti_src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for i in range(5):
        write_case(src / "siemens", f"case{i}", i)
        write_case(src / "philips", f"p{i}", 10 + i, suffix="_seg")
    return src


def test_import_nifti_2d_slices(nifti_src: Path, tmp_path: Path) -> None:
    result = import_nifti(
        nifti_src,
        tmp_path / "fed",
        class_names=["bg", "prostate"],
        mode="2d",
        shape=(12, 12),
        mapping={0: 0, 255: 1},
        mask_suffix="_seg",
        test_fraction=0.2,
        seed=0,
    )
    assert result.dropped_slices == 10 * 6
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    site = fed.manifest.sites[1]
    assert site.name == "siemens" and site.splits["test"] == 4  # one case = 4 slices
    train, test = fed.load("siemens", "train"), fed.load("siemens", "test")
    cases = lambda ids: {i.rsplit("_", 1)[0] for i in ids}  # noqa: E731
    assert not cases(train.ids) & cases(test.ids)  # splits never cut a case
    assert train.images.shape == (16, 1, 12, 12)
    assert train.spacing[0] == pytest.approx((1.5 * 20 / 12, 2.0 * 24 / 12))
    grey = train.images[:, 0]
    assert grey[train.masks == 1].mean() > grey[train.masks == 0].mean() + 0.3


@pytest.mark.parametrize(
    ("fit", "spacing"),
    [("resize", (3.0 * 10 / 8, 1.5 * 20 / 16, 2.0 * 24 / 16)), ("crop", (3.0, 1.5, 2.0))],
)
def test_import_nifti_3d_volumes(nifti_src: Path, tmp_path: Path, fit: str, spacing: tuple) -> None:
    result = import_nifti(
        nifti_src,
        tmp_path / "fed",
        class_names=["bg", "prostate"],
        mode="3d",
        shape=(8, 16, 16),
        fit=fit,
        mapping={0: 0, 255: 1},
        mask_suffix="_seg",
        val_fraction=0.25,
        seed=1,
    )
    assert result.manifest.ndim == 3 and result.dropped_slices == 0
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    split = fed.load("philips", "train")
    assert split.images.shape[1:] == (1, 8, 16, 16)
    assert split.spacing[0] == pytest.approx(spacing)
    assert split.masks.sum() > 0
    grey = split.images[:, 0]
    assert grey[split.masks == 1].mean() > grey[split.masks == 0].mean() + 0.3


def test_import_nifti_errors(nifti_src: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"values \[255\] are not within 0"):
        import_nifti(
            nifti_src,
            tmp_path / "a",
            class_names=["bg", "fg"],
            mode="2d",
            shape=(12, 12),
            mapping={0: 0, 1: 1},
            mask_suffix="_seg",
        )
    with pytest.raises(DataError, match=r"label values must be classes 0..1, got \[255\]"):
        import_nifti(
            nifti_src,
            tmp_path / "b",
            class_names=["bg", "fg"],
            mode="2d",
            shape=(12, 12),
            mask_suffix="_seg",
        )
    with pytest.raises(DataError, match=r"need mode 2d with a \(H, W\) shape"):
        import_nifti(nifti_src, tmp_path / "c", class_names=["bg", "fg"], mode="3d", shape=(12, 12))


def _nuclei_list_site(root: Path, site: str, n_train: int, n_val: int) -> None:
    """The RethinkFL/FedBCS nuclei layout: ``root/<site>/{train,val}.txt`` listing
    ``image label`` pairs relative to ``root``; labels are instance maps (>0: nucleus)."""
    rng = np.random.default_rng(len(site))
    (root / site / "img").mkdir(parents=True)
    (root / site / "lab").mkdir()
    for split, n in (("train", n_train), ("val", n_val)):
        lines = []
        for i in range(n):
            image = (rng.random((20, 20, 3)) * 255).astype(np.uint8)
            label = np.zeros((20, 20), np.uint8)
            label[2:6, 2:6], label[10:14, 8:12] = 1, 2  # two nuclei instances
            cv2.imwrite(str(root / site / "img" / f"{split}{i}.png"), image)
            cv2.imwrite(str(root / site / "lab" / f"{split}{i}.png"), label)
            lines.append(f"{site}/img/{split}{i}.png {site}/lab/{split}{i}.png")
        (root / site / f"{split}.txt").write_text("\n".join(lines) + "\n")


def test_import_folder_reads_list_file_layouts(tmp_path: Path) -> None:
    src = tmp_path / "data"
    _nuclei_list_site(src, "TNBC", 3, 2)
    _nuclei_list_site(src, "KIRC", 4, 1)
    m = import_folder(
        src, tmp_path / "fed", class_names=["background", "nuclei"],
        mapping={0: 0, 1: 1, 2: 1}, size=(16, 16), val_fraction=0.0,
    )  # fmt: skip
    assert m.site_names == ["KIRC", "TNBC"]
    assert m.sites[1].splits == {"train": 3, "val": 0, "test": 2}  # val.txt is the eval list
    fed = FederatedDataset.open(tmp_path / "fed")
    assert check_federation(fed) == []
    assert set(fed.load("TNBC", "test").masks.unique().tolist()) == {0, 1}
    (src / "KIRC" / "train.txt").write_text("KIRC/img/train0.png\n")
    with pytest.raises(DataError, match=r"KIRC/train.txt:1: expected 'image mask'"):
        import_folder(src, tmp_path / "f2", class_names=["bg", "n"], mapping={0: 0}, size=(8, 8))
    (src / "KIRC" / "train.txt").write_text("KIRC/img/nope.png KIRC/lab/train0.png\n")
    with pytest.raises(DataError, match=r"KIRC/train.txt:1: .*nope.png does not exist"):
        import_folder(src, tmp_path / "f3", class_names=["bg", "n"], mapping={0: 0}, size=(8, 8))
    assert not (tmp_path / "f2").exists() and not (tmp_path / "f3").exists()
