"""Damaged or malformed federation folders and importer inputs: each is refused by
``fedseg data check`` (exit 1), ``fedseg run`` and the importers (exit 2) with one line naming
the file or field and what was expected; no traceback, no bare ``Aborted.``, and a failed
import leaves no half-written output folder."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cv2
import h5py
import nibabel as nib
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data import FederatedDataset, check_federation
from fedseg.errors import DataError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    root = tmp_path_factory.mktemp("fed") / "fundus"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    generate_weak_labels(root, seed=0)
    return root


@pytest.fixture
def fed(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "fed"))


def _cli(*args: str | Path) -> tuple[int, str]:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exception is None or isinstance(out.exception, SystemExit), repr(out.exception)
    assert "Traceback" not in out.output and "Aborted" not in out.output, out.output
    return out.exit_code, out.output


def _refused_everywhere(fed: Path, tmp: Path, *expected: str, check_code: int = 1) -> None:
    """``data check`` exits ``check_code`` (1: problems listed, 2: the folder cannot be
    opened) and ``run`` exits 2, each with one line holding all of ``expected``."""
    code, text = _cli("data", "check", fed, "--labels", "weak")
    assert code == check_code, text
    assert any(all(e in line for e in expected) for line in text.splitlines()), text
    raw = {
        "name": "bad",
        "seed": 1,
        "data": {"root": str(fed), "labels": "weak"},
        "train": {"rounds": 1, "local_iters": 1, "batch_size": 2, "augment": False},
        "engine": {"device": "cpu"},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(raw))
    out = Path(tempfile.mkdtemp(dir=tmp)) / "run"
    code, text = _cli("run", tmp / "run.yaml", "--out", out)
    assert code == 2, text
    assert any(all(e in line for e in expected) for line in text.splitlines()), text
    assert not (out / "results.json").exists()


def _sample(fed: Path, k: int = 0, split: str = "train") -> Path:
    return sorted((fed / "sites" / "A" / split).glob("*.npz"))[k]


def _weak(fed: Path, k: int = 0) -> Path:
    return sorted((fed / "sites" / "A" / "train" / "weak").glob("*.npy"))[k]


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# ------------------------------------------------------------- damaged .npz / weak .npy files
def _zip_then_garbage(raw: bytes) -> bytes:
    return raw[:40] + bytes(range(256)) * 2


def _cut_short(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _flip_bytes(raw: bytes) -> bytes:
    b = bytearray(raw)
    for i in range(len(b) // 2, len(b) // 2 + 16):  # inside the stored image data
        b[i] ^= 0xFF
    return bytes(b)


def _empty(raw: bytes) -> bytes:
    return b""


DAMAGE = {
    "zip header then garbage": _zip_then_garbage,
    "cut short": _cut_short,
    "bytes flipped": _flip_bytes,
    "0 bytes": _empty,
}


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_sample_file(fed, tmp_path, how):
    path = _sample(fed)
    path.write_bytes(DAMAGE[how](path.read_bytes()))
    _refused_everywhere(fed, tmp_path, f"{path}: damaged or unreadable as an .npz sample")
    with pytest.raises(DataError, match=rf"{path.name}: damaged or unreadable"):
        FederatedDataset.open(fed).load("A", "train")


@pytest.mark.parametrize("how", ["cut short", "0 bytes"])
def test_weak_labels_of_a_damaged_sample_keep_the_old_labels(fed, how):
    path, weak = _sample(fed, split="test"), _weak(fed)
    before = weak.read_bytes()
    path.write_bytes(DAMAGE[how](path.read_bytes()))
    code, text = _cli("data", "weak-labels", fed)
    assert code == 2 and f"{path}: damaged or unreadable as an .npz sample" in text, text
    assert weak.read_bytes() == before  # nothing was deleted before the damage was found


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_weak_label_file(fed, tmp_path, how):
    path = _weak(fed)
    path.write_bytes(DAMAGE[how](path.read_bytes()))
    expected = "damaged or unreadable as a .npy array"
    if how == "bytes flipped":  # .npy has no checksum: the flipped bytes are label values
        expected = "weak label values must be classes 0..2 or 255 (unlabeled)"
    _refused_everywhere(fed, tmp_path, f"{path}: {expected}")
    with pytest.raises(DataError, match=rf"{path.name}: "):
        FederatedDataset.open(fed).load("A", "train", "weak")


def test_a_single_array_named_npz_and_an_archive_named_npy(fed, tmp_path):
    sample, weak = _sample(fed), _weak(fed)
    np.save(tmp_path / "a.npy", _arrays(sample)["image"])
    (tmp_path / "a.npy").replace(sample)
    np.savez(tmp_path / "b.npz", weak=np.load(weak))
    (tmp_path / "b.npz").replace(weak)
    _refused_everywhere(fed, tmp_path, f"{sample}: holds one .npy array")
    _refused_everywhere(fed, tmp_path, f"{weak}: is an .npz archive")


# ------------------------------------------------------------------ image / mask contract
IMAGE = 3, 32, 32
IMAGES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "string": (lambda x: x.astype(str), "image dtype must be float32"),
    "uint8 0-255": (lambda x: (x * 255).astype(np.uint8), "image dtype must be float32"),
    "bool": (lambda x: x > 0.5, "image dtype must be float32"),
    "complex": (lambda x: x.astype(np.complex64), "image dtype must be float32"),
    "float64": (lambda x: x.astype(np.float64), "image dtype must be float32"),
    "1e30": (lambda x: x + np.float32(1e30), "image values must lie in [-1000, 1000]"),
    "-2000": (lambda x: x - np.float32(2000), "image values must lie in [-1000, 1000]"),
    "NaN": (lambda x: np.where(x > 0.5, np.nan, x).astype(np.float32), "non-finite values"),
    "inf": (lambda x: np.full_like(x, np.inf), f"image holds {np.prod(IMAGE)} non-finite"),
    "channels": (lambda x: x[:1], "image has 1 channels, the manifest says channels=3"),
    "no channel axis": (lambda x: x[0], "image shape must be (3, 32, 32)"),
}


@pytest.mark.parametrize("kind", IMAGES)
def test_image_outside_the_contract(fed, tmp_path, kind):
    edit, expected = IMAGES[kind]
    path = _sample(fed)
    arrays = _arrays(path)
    np.savez(path, **{**arrays, "image": edit(arrays["image"])})
    _refused_everywhere(fed, tmp_path, f"{path}: ", expected)
    with pytest.raises(DataError, match=rf"{path.name}: "):
        FederatedDataset.open(fed).load("A", "train")


MASKS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "float": (lambda m: m.astype(np.float32), "mask dtype must be an integer type"),
    "bool": (lambda m: m > 0, "mask dtype must be an integer type"),
    "class 9": (lambda m: np.where(m == 0, 9, m).astype(np.uint8), "classes 0..2, got [9]"),
    "negative": (lambda m: m.astype(np.int16) - 1, "classes 0..2, got [-1]"),
    "shape": (lambda m: m[:, :30], "mask shape must be (32, 32), got (32, 30)"),
}


@pytest.mark.parametrize("kind", MASKS)
def test_mask_outside_the_contract(fed, tmp_path, kind):
    edit, expected = MASKS[kind]
    path = _sample(fed)
    arrays = _arrays(path)
    np.savez(path, **{**arrays, "mask": edit(arrays["mask"])})
    _refused_everywhere(fed, tmp_path, f"{path}: ", expected)
    with pytest.raises(DataError, match=rf"{path.name}: "):
        FederatedDataset.open(fed).load("A", "train")


@pytest.mark.parametrize(
    "weak, expected",
    [
        (np.full((32, 32), 0.0), "weak label dtype must be an integer type"),
        (np.full((32, 32), 7, np.uint8), "weak label values must be classes 0..2 or 255"),
        (np.zeros((16, 16), np.uint8), "weak label shape must be (32, 32)"),
    ],
    ids=["float", "value 7", "shape"],
)
def test_weak_label_outside_the_contract(fed, tmp_path, weak, expected):
    path = _weak(fed)
    np.save(path, weak)
    _refused_everywhere(fed, tmp_path, f"{path}: {expected}")
    with pytest.raises(DataError, match=rf"{path.name}: "):
        FederatedDataset.open(fed).load("A", "train", "weak")


@pytest.mark.parametrize(
    "spacing",
    [np.array(["a", "b"]), np.array([1.0]), np.array([0.0, 1.0]), np.array([np.nan, 1.0])],
    ids=["strings", "one value", "zero", "NaN"],
)
def test_bad_spacing(fed, tmp_path, spacing):
    for path in (fed / "sites").glob("*/*/*.npz"):  # valid spacing everywhere ...
        np.savez(path, **_arrays(path), spacing=np.ones(2))
    path = _sample(fed)
    np.savez(path, **{**_arrays(path), "spacing": spacing})  # ... but on this sample
    _refused_everywhere(fed, tmp_path, f"{path}: spacing must be 2 finite positive numbers")
    with pytest.raises(DataError, match=rf"{path.name}: spacing must be"):
        FederatedDataset.open(fed).load("A", "train")


def test_spacing_on_only_some_samples(fed, tmp_path):
    path = _sample(fed, 1)
    np.savez(path, **_arrays(path), spacing=np.array([0.5, 0.5]))
    site = fed / "sites" / "A"
    _refused_everywhere(fed, tmp_path, f"{site}: 1 of ", f"(train/{path.stem}) carry 'spacing'")
    with pytest.raises(DataError, match=r"A/train: 1 of \d+ samples carry 'spacing'"):
        FederatedDataset.open(fed).load("A", "train")


# --------------------------------------------------------------- manifest and folder layout
def _edit_manifest(fed: Path, edit: Callable[[dict], object]) -> None:
    data = json.loads((fed / "manifest.json").read_text())
    edit(data)
    (fed / "manifest.json").write_text(json.dumps(data))


LAYOUT: dict[str, tuple[Callable[[Path], object], str, str]] = {
    "manifest not JSON": (
        lambda f: (f / "manifest.json").write_text("{'sites': "),
        "manifest.json",
        "not valid JSON",
    ),
    "manifest empty": (
        lambda f: (f / "manifest.json").write_bytes(b""),
        "manifest.json",
        "not valid JSON (the file is empty)",
    ),
    "manifest not UTF-8": (
        lambda f: (f / "manifest.json").write_bytes(b"\xff\xfe{}"),
        "manifest.json",
        "not valid JSON",
    ),
    "manifest a list": (
        lambda f: (f / "manifest.json").write_text("[]"),
        "manifest.json",
        "valid dictionary",
    ),
    "manifest missing keys": (
        lambda f: _edit_manifest(f, lambda d: d.pop("class_names")),
        "manifest.json",
        "class_names: Field required",
    ),
    "manifest split size not a number": (
        lambda f: _edit_manifest(f, lambda d: d["sites"][0]["splits"].update(train="many")),
        "manifest.json",
        "sites.0.splits.train",
    ),
    "manifest a folder": (
        lambda f: ((f / "manifest.json").unlink(), (f / "manifest.json").mkdir()),
        "manifest.json",
        "is not a file",
    ),
}


@pytest.mark.parametrize("kind", LAYOUT)
def test_broken_manifest(fed, tmp_path, kind):
    edit, name, expected = LAYOUT[kind]
    edit(fed)
    _refused_everywhere(fed, tmp_path, f"{fed / name}", expected, check_code=2)


@pytest.mark.parametrize("kind", ["missing sample", "empty site", "stray site folder"])
def test_folder_disagrees_with_the_manifest(fed, tmp_path, kind):
    if kind == "missing sample":
        _sample(fed, 0, "test").unlink()
        expected = (f"{fed / 'sites' / 'A' / 'test'}: manifest says",)
    elif kind == "empty site":
        shutil.rmtree(fed / "sites" / "B")
        _edit_manifest(fed, lambda d: d["sites"][1].update(splits={}))
        expected = ("manifest.json", "site 'B' has no samples in any split")
    else:
        shutil.copytree(fed / "sites" / "B", fed / "sites" / "Z")
        expected = (f"{fed / 'sites' / 'Z'}: site folder not listed in manifest.json",)
    _refused_everywhere(fed, tmp_path, *expected)


# ---------------------------------------------------------------------------------- importers
def _import_h5(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    return _cli("data", "import-h5", src, out, "--classes", "bg,fg", *extra)


def _h5_site(src: Path, n: int = 3, image_dtype: type = np.float32) -> Path:
    folder = src / "Domain1" / "train"
    folder.mkdir(parents=True)
    for i in range(n):
        mask = np.zeros((16, 16), np.uint8)
        mask[4:12, 4 + i : 10 + i] = 1
        with h5py.File(folder / f"case{i}.h5", "w") as f:
            f["image"] = (mask * 0.8 + 0.1).astype(image_dtype)
            f["mask"] = mask
    return folder


def _no_output(out: Path) -> None:
    assert not out.exists(), sorted(out.rglob("*"))


@pytest.mark.parametrize("how", ["garbage", "cut short", "0 bytes"])
def test_import_h5_with_a_damaged_file(tmp_path, how):
    folder = _h5_site(tmp_path / "src")
    bad = folder / "case2.h5"  # the last file: two samples are written before it fails
    raw = bad.read_bytes()
    bad.write_bytes({"garbage": b"not hdf5" * 100, "cut short": raw[:600], "0 bytes": b""}[how])
    code, text = _import_h5(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{bad}: damaged or unreadable as an HDF5 file" in text, text
    _no_output(tmp_path / "out")


def test_import_h5_with_integer_images(tmp_path):
    folder = _h5_site(tmp_path / "src", image_dtype=np.uint8)
    code, text = _import_h5(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{folder / 'case0.h5'}: image must be floating point" in text, text
    _no_output(tmp_path / "out")


def test_failed_import_keeps_the_federation_it_would_replace(tmp_path):
    _h5_site(tmp_path / "src")
    assert _import_h5(tmp_path / "src", tmp_path / "out")[0] == 0
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    bad = tmp_path / "src" / "Domain1" / "train" / "case1.h5"
    bad.write_bytes(b"")
    code, text = _import_h5(tmp_path / "src", tmp_path / "out", "--overwrite")
    assert code == 2 and str(bad) in text, text
    after = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "manifest.json", "notes.txt", "sites"
    ]  # fmt: skip
    (tmp_path / "src" / "Domain1" / "train" / "case1.h5").unlink()
    assert _import_h5(tmp_path / "src", tmp_path / "out", "--overwrite")[0] == 0
    fed = FederatedDataset.open(tmp_path / "out")
    assert fed.manifest.sites[0].splits["train"] == 2 and check_federation(fed) == []
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"  # not part of a federation


def _nifti_site(src: Path, n: int = 2) -> Path:
    for folder in ("images", "labels"):
        (src / "ucl" / folder).mkdir(parents=True)
    for i in range(n):
        label = np.zeros((12, 12, 4), np.uint8)
        label[3:9, 3 + i : 9, :] = 1
        for folder, data in (("images", label * 100.0 + 5), ("labels", label)):
            nib.save(nib.Nifti1Image(data, np.eye(4)), src / "ucl" / folder / f"c{i}.nii.gz")
    return src / "ucl"


def _import_nifti(src: Path, out: Path) -> tuple[int, str]:
    return _cli("data", "import-nifti", src, out, "--classes", "bg,p", "--shape", "12")


NIFTI: dict[str, Callable[[Path], object]] = {
    "garbage": lambda p: p.write_bytes(b"\x00not nifti" * 50),
    "gzip of garbage": lambda p: p.write_bytes(gzip.compress(b"\x00not nifti" * 50)),
    "cut short": lambda p: p.write_bytes(p.read_bytes()[:-40]),
    "0 bytes": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("how", NIFTI)
def test_import_nifti_with_a_damaged_volume(tmp_path, how):
    site = _nifti_site(tmp_path / "src")
    bad = site / "images" / "c1.nii.gz"  # the last case: c0 is written before it fails
    NIFTI[how](bad)
    code, text = _import_nifti(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{bad}: damaged or unreadable as a NIfTI volume" in text, text
    _no_output(tmp_path / "out")


@pytest.mark.parametrize("shape", [(12, 12), (12, 12, 4, 2)], ids=["2D", "4D"])
def test_import_nifti_of_the_wrong_dimensionality(tmp_path, shape):
    site = _nifti_site(tmp_path / "src")
    bad = site / "labels" / "c1.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros(shape, np.uint8), np.eye(4)), bad)
    code, text = _import_nifti(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{bad}: label must be a 3D volume (x, y, z), got shape" in text, text
    _no_output(tmp_path / "out")


def test_import_nifti_image_and_label_of_different_shapes(tmp_path):
    site = _nifti_site(tmp_path / "src")
    bad = site / "labels" / "c0.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((12, 10, 4), np.uint8), np.eye(4)), bad)
    code, text = _import_nifti(tmp_path / "src", tmp_path / "out")
    assert code == 2 and str(site / "images" / "c0.nii.gz") in text and str(bad) in text, text
    _no_output(tmp_path / "out")


def _folder_site(src: Path, mask_side: int = 40) -> Path:
    site = src / "refuge"
    for sub in ("images", "masks"):
        (site / sub).mkdir(parents=True)
    for i in range(3):
        cv2.imwrite(str(site / "images" / f"img{i}.png"), np.full((40, 40, 3), 90, np.uint8))
        side = mask_side if i == 2 else 40
        cv2.imwrite(str(site / "masks" / f"img{i}.png"), np.zeros((side, side), np.uint8))
    return site


def _import_folder(src: Path, out: Path) -> tuple[int, str]:
    args = ("--classes", "bg,fg", "--mapping", "0=0,255=1", "--size", "16", "--test-fraction", "0")
    return _cli("data", "import-folder", src, out, *args)


def test_import_folder_refuses_a_mask_of_another_size(tmp_path):
    site = _folder_site(tmp_path / "src", mask_side=30)
    code, text = _import_folder(tmp_path / "src", tmp_path / "out")
    image, mask = site / "images" / "img2.png", site / "masks" / "img2.png"
    assert code == 2, text
    assert f"{image} is 40x40 px but its mask {mask} is 30x30 px" in text, text
    _no_output(tmp_path / "out")


def test_import_folder_refuses_two_images_with_one_stem(tmp_path):
    site = _folder_site(tmp_path / "src")
    cv2.imwrite(str(site / "images" / "img0.jpg"), np.zeros((40, 40, 3), np.uint8))
    code, text = _import_folder(tmp_path / "src", tmp_path / "out")
    assert code == 2, text
    assert f"{site / 'images' / 'img0.jpg'} and {site / 'images' / 'img0.png'}" in text, text
    _no_output(tmp_path / "out")


def test_import_folder_refuses_an_unreadable_image(tmp_path):
    site = _folder_site(tmp_path / "src")
    (site / "images" / "img1.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    code, text = _import_folder(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{site / 'images' / 'img1.png'}: cannot be read" in text, text
    _no_output(tmp_path / "out")


def test_import_folder_of_a_site_with_images_but_no_masks(tmp_path):
    site = _folder_site(tmp_path / "src")
    shutil.rmtree(site / "masks")
    code, text = _import_folder(tmp_path / "src", tmp_path / "out")
    assert code == 2 and f"{site}: has images/ but no masks/; expected both" in text, text
    _no_output(tmp_path / "out")


@pytest.mark.parametrize("which", ["sample", "weak label"])
def test_a_pipe_in_place_of_a_file_does_not_hang_the_check(fed, tmp_path, which):
    path = _sample(fed) if which == "sample" else _weak(fed)
    path.unlink()
    os.mkfifo(path)  # reading it would block forever
    check = "from fedseg.data.cli import app; app()"
    args = [sys.executable, "-c", check, "check", str(fed), "--labels", "weak"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in text, text
    folder = path.parent.parent if which == "weak label" else path.parent
    expected = "manifest says" if which == "sample" else f"weak labels missing for {path.stem}"
    assert any(str(folder) in line and expected in line for line in text.splitlines()), text


def test_import_into_a_file_or_below_one(tmp_path):
    _h5_site(tmp_path / "src")
    (tmp_path / "file").write_text("x")
    code, text = _import_h5(tmp_path / "src", tmp_path / "file")
    assert code == 2 and f"{tmp_path / 'file'} is a file" in text, text
    code, text = _import_h5(tmp_path / "src", tmp_path / "file" / "out")
    assert code == 2 and f"cannot write into {tmp_path / 'file' / 'out'}" in text, text
