"""Manifest validation: defaults, consistency rules, errors that name file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedseg.data import FederatedDataset, Manifest, sparsity_of
from fedseg.data.manifest import read_manifest, write_manifest
from fedseg.errors import DataError


def raw(**changes: object) -> dict:
    base = {
        "task": "t",
        "class_names": ["background", "cup", "rim"],
        "modality": "fundus",
        "channels": 3,
        "ndim": 2,
        "spatial_shape": [32, 32],
        "sites": [{"name": "A", "annotation": "point", "sparsity": "sparse"}],
    }
    return {**base, **changes}


def write(tmp_path: Path, data: dict) -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    return tmp_path


def test_defaults_regions_ignore_index_and_splits() -> None:
    m = Manifest.model_validate(raw())
    assert m.num_classes == 3
    assert m.ignore_index == 255
    assert m.regions == {"cup": [1], "rim": [2]}
    assert m.sites[0].splits == {"train": 0, "val": 0, "test": 0}
    assert m.site_names == ["A"]


def test_round_trip(tmp_path: Path) -> None:
    m = Manifest.model_validate(raw(regions={"cup": [1], "disc": [1, 2]}))
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == m
    assert FederatedDataset.open(tmp_path).manifest.regions["disc"] == [1, 2]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"ndim": 4}, "ndim"),
        ({"class_names": ["bg"]}, "class_names"),
        ({"spatial_shape": [32]}, "spatial_shape"),
        ({"regions": {"disc": [3]}}, "regions.disc"),
        ({"ignore_index": 1}, "ignore_index"),
        ({"sites": [{"name": "A", "annotation": "lasso"}]}, "sites.0.annotation"),
        ({"sites": [{"name": "A", "annotation": "point"}]}, "sparsity"),
        ({"sites": [{"name": "A", "splits": {"train": 1, "dev": 2}}]}, "splits"),
        ({"sites": [{"name": "A"}, {"name": "A"}]}, "unique"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_manifest_names_file_and_field(tmp_path: Path, changes: dict, field: str) -> None:
    root = write(tmp_path, raw(**changes))
    with pytest.raises(DataError) as info:
        FederatedDataset.open(root)
    assert str(root / "manifest.json") in info.value.reason
    assert field in info.value.reason


def test_missing_and_broken_manifest(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist.*fedseg data synth"):
        FederatedDataset.open(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match=r"not valid JSON"):
        FederatedDataset.open(tmp_path)


@pytest.mark.parametrize(
    ("annotation", "conversion", "expected"),
    [
        ("full", "block", None),
        ("point", "block", "sparse"),
        ("scribble", "block", "medium"),
        ("scribble2", "block", "medium"),
        ("block", "scribble", "dense"),
        ("box", "scribble", "medium"),
        ("rotated_box", "block", "dense"),
    ],
)
def test_sparsity_after_box_conversion(annotation: str, conversion: str, expected: str) -> None:
    assert sparsity_of(annotation, conversion) == expected
