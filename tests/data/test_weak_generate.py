"""``generate_weak_labels`` on a federation folder: manifest updates, overrides, determinism."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from fedseg.data import FederatedDataset, check_federation
from fedseg.data.weak import generate_weak_labels
from fedseg.errors import DataError


def digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.read_bytes())
    return h.hexdigest()


def test_manifest_records_seed_annotations_and_sparsity(fundus_root: Path) -> None:
    m = FederatedDataset.open(fundus_root).manifest
    assert m.weak_labels is not None and m.weak_labels.origin == "synthesized"
    assert m.weak_labels.seed == 0
    assert m.weak_labels.annotations == {s.name: s.annotation for s in m.sites}
    assert m.box_conversion == "scribble"


def test_overrides_regenerate_without_touching_images(fed_copy: Path) -> None:
    images = list((fed_copy / "sites").rglob("*.npz"))
    before = digest(images)
    m = generate_weak_labels(
        fed_copy, seed=1, annotations={"A": "block", "C": "full"}, box_conversion="block"
    )
    assert digest(images) == before
    sites = {s.name: s for s in m.sites}
    assert (sites["A"].annotation, sites["A"].sparsity) == ("block", "dense")
    assert (sites["C"].annotation, sites["C"].sparsity) == ("full", None)
    assert not (fed_copy / "sites" / "C" / "train" / "weak").exists()
    assert m.box_conversion == "block"
    fed = FederatedDataset.open(fed_copy)
    assert check_federation(fed, labels="weak") == []
    a = fed.load("A", "train", "weak")
    assert (a.labels != 255).float().mean() > 0.4  # blocks are dense
    c = fed.load("C", "train", "weak")
    assert np.array_equal(c.labels, c.masks)


def test_same_seed_same_files_other_seed_other_files(fed_copy: Path) -> None:
    weak = lambda: list((fed_copy / "sites").rglob("weak/*.npy"))  # noqa: E731
    first = digest(weak())
    generate_weak_labels(fed_copy, seed=0)
    assert digest(weak()) == first
    generate_weak_labels(fed_copy, seed=5)
    assert digest(weak()) != first


def test_every_split_gets_weak_labels(fundus_root: Path) -> None:
    fed = FederatedDataset.open(fundus_root)
    for split in ("train", "val", "test"):
        assert len(fed.load("D", split, "weak")) == fed.manifest.sites[3].splits[split]


def test_bad_overrides(fed_copy: Path) -> None:
    with pytest.raises(DataError, match=r"unknown sites \['Q'\]"):
        generate_weak_labels(fed_copy, annotations={"Q": "point"})
    with pytest.raises(DataError, match=r"annotation types must be in"):
        generate_weak_labels(fed_copy, annotations={"A": "lasso"})
