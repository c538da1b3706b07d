"""Loading a federation folder: tensors, weak labels, empty splits, spacing, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedseg.data import FederatedDataset, FederationWriter, check_federation
from fedseg.errors import DataError


def test_load_full_and_weak(fundus_root: Path) -> None:
    fed = FederatedDataset.open(fundus_root)
    assert fed.root == fundus_root
    assert fed.site_names == ["A", "B", "C", "D", "E"]
    info = fed.manifest.sites[0]
    full = fed.load("A", "train")
    n = info.splits["train"]
    assert full.images.shape == (n, 3, 32, 32) and full.images.dtype == torch.float32
    assert full.masks.shape == (n, 32, 32) and full.masks.dtype == torch.int64
    assert torch.equal(full.labels, full.masks)
    assert full.ids == sorted(full.ids) and len(full) == n
    assert full.spacing is None
    weak = fed.load("A", "train", labels="weak")
    assert torch.equal(weak.masks, full.masks) and torch.equal(weak.images, full.images)
    values = set(weak.labels.unique().tolist())
    assert values <= {0, 1, 2, 255} and 255 in values
    labeled = weak.labels != 255
    assert labeled.float().mean() < 0.5
    assert set(weak.labels[labeled].unique().tolist()) == {0, 1, 2}


def test_fundus_regions_and_annotations(fundus_root: Path) -> None:
    m = FederatedDataset.open(fundus_root).manifest
    assert m.regions == {"cup": [1], "disc": [1, 2]}
    assert [s.annotation for s in m.sites] == ["scribble", "scribble2", "box", "point", "block"]
    assert [s.sparsity for s in m.sites] == ["medium", "medium", "medium", "sparse", "dense"]


def test_empty_split_returns_empty_tensors(tmp_path: Path) -> None:
    w = FederationWriter(
        tmp_path,
        task="t",
        class_names=["bg", "fg"],
        modality="x",
        channels=1,
        spatial_shape=(8, 8),
    )
    w.add("A", "train", "a", np.zeros((1, 8, 8), np.float32), np.zeros((8, 8), np.uint8))
    w.finish({"A": "full"})
    split = FederatedDataset.open(tmp_path).load("A", "val", "weak")
    assert split.images.shape == (0, 1, 8, 8) and split.labels.shape == (0, 8, 8)
    assert split.ids == [] and split.spacing is None


def test_spacing_is_returned_per_sample(tmp_path: Path) -> None:
    w = FederationWriter(
        tmp_path,
        task="t",
        class_names=["bg", "fg"],
        modality="x",
        channels=1,
        spatial_shape=(4, 8, 8),
    )
    for i, sp in enumerate([(2.0, 1.0, 1.0), (3.0, 0.5, 0.5)]):
        w.add("A", "train", f"v{i}", np.ones((1, 4, 8, 8)), np.zeros((4, 8, 8)), spacing=sp)
    w.finish({"A": "full"})
    split = FederatedDataset.open(tmp_path).load("A", "train")
    assert split.images.shape == (2, 1, 4, 8, 8)
    assert split.spacing == [(2.0, 1.0, 1.0), (3.0, 0.5, 0.5)]


def test_weak_labels_never_generated(fed_copy: Path) -> None:
    data = json.loads((fed_copy / "manifest.json").read_text())
    data["weak_labels"] = None
    (fed_copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"fedseg data weak-labels"):
        FederatedDataset.open(fed_copy).load("A", "train", "weak")
    FederatedDataset.open(fed_copy).load("A", "train", "full")  # full labels still load


def test_stale_or_missing_weak_files(fed_copy: Path) -> None:
    data = json.loads((fed_copy / "manifest.json").read_text())
    data["sites"][0].update(annotation="block", sparsity="dense")
    (fed_copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"made for 'scribble'.*'block'"):
        FederatedDataset.open(fed_copy).load("A", "train", "weak")
    shutil.rmtree(fed_copy / "sites" / "B" / "train" / "weak")
    with pytest.raises(DataError, match=r"weak label missing"):
        FederatedDataset.open(fed_copy).load("B", "train", "weak")


def test_bad_arguments_and_mismatches(fed_copy: Path) -> None:
    fed = FederatedDataset.open(fed_copy)
    with pytest.raises(DataError, match=r"unknown site 'Z'.*'A'"):
        fed.load("Z", "train")
    with pytest.raises(DataError, match=r"split must be one of"):
        fed.load("A", "dev")
    with pytest.raises(DataError, match=r"labels must be"):
        fed.load("A", "train", "noisy")  # type: ignore[arg-type]
    next((fed_copy / "sites" / "A" / "test").glob("*.npz")).unlink()
    with pytest.raises(DataError, match=r"manifest says .* found"):
        fed.load("A", "test")
    sample = next((fed_copy / "sites" / "A" / "train").glob("*.npz"))
    np.savez(sample, image=np.zeros((3, 16, 16), np.float32), mask=np.zeros((32, 32), np.uint8))
    with pytest.raises(DataError, match=f"{sample.name}: image shape must be"):
        fed.load("A", "train")


def _writer(out: Path) -> FederationWriter:
    return FederationWriter(
        out, task="t", class_names=["bg", "fg"], modality="x", channels=1, spatial_shape=(8, 8)
    )


def test_writer_shows_the_federation_only_when_finished(tmp_path: Path) -> None:
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f".partial-{dead.pid}-0a0b"  # left by a killed import
    stale.mkdir(parents=True)
    image, mask = np.zeros((1, 8, 8), np.float32), np.zeros((8, 8), np.uint8)
    w = _writer(out)
    assert not stale.exists()
    w.add("A", "train", "a", image, mask)
    assert not (out / "sites").exists() and not (out / "manifest.json").exists()
    with pytest.raises(DataError, match=r"A/train/a: sample id 'a' occurs twice in A/train"):
        w.add("A", "train", "a", image, mask)
    with pytest.raises(DataError, match=r"A/train/b: mask must hold whole class numbers"):
        w.add("A", "train", "b", image, mask + 0.5)
    w.finish({"A": "full"})
    assert check_federation(FederatedDataset.open(out)) == []
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "sites"]

    live = out / f".partial-{os.getpid()}-0c0d"  # an import into `out` still running
    live.mkdir()
    with pytest.raises(DataError, match=r"is not empty"):
        _writer(out)
    assert live.exists()

    too_bright = r"x.png: image values must lie in \[-1000, 1000\]"
    with pytest.raises(DataError, match=too_bright), _writer(tmp_path / "new") as w:
        w.add("A", "train", "a", image, mask)
        w.add("A", "train", "b", image + 4000, mask, origin="x.png")
    assert not (tmp_path / "new").exists()
