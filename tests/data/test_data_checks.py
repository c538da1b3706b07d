"""``check`` / ``require_valid``: every kind of problem is found and reported with its path."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fedseg.data import FederatedDataset, check_federation, require_valid
from fedseg.errors import DataError


def problems(root: Path, **kwargs: object) -> list[str]:
    return [str(p) for p in check_federation(FederatedDataset.open(root), **kwargs)]  # type: ignore[arg-type]


def edit_manifest(root: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))


def first_sample(root: Path, site: str = "C", split: str = "train") -> Path:
    return sorted((root / "sites" / site / split).glob("*.npz"))[0]


def test_valid_federation_has_no_problems(fundus_root: Path) -> None:
    assert problems(fundus_root, batch_size=2, labels="weak") == []
    assert require_valid(fundus_root, 2, labels="weak").site_names[0] == "A"


def test_batch_size_larger_than_a_train_split(fundus_root: Path) -> None:
    found = problems(fundus_root, batch_size=12)
    assert any("site 'A' has" in p and "fewer than the batch size 12" in p for p in found)


def test_sample_level_problems(fed_copy: Path) -> None:
    path = first_sample(fed_copy)
    with np.load(path) as z:
        image, mask = z["image"].copy(), z["mask"].copy()
    image[0, 0, 0] = np.nan
    np.savez(path, image=image, mask=mask[:, :30])
    found = [p for p in problems(fed_copy) if path.name in p]
    assert any("mask shape must be (32, 32), got (32, 30)" in p for p in found)
    assert any("image holds 1 non-finite values" in p for p in found)
    mask[0, 0] = 7
    np.savez(path, image=image[:2], mask=mask)
    found = [p for p in problems(fed_copy) if path.name in p]
    assert any("mask values must be classes 0..2, got [7]" in p for p in found)
    assert any("image has 2 channels, the manifest says channels=3" in p for p in found)
    np.savez(path, picture=image)
    assert any("needs arrays 'image' and 'mask', has ['picture']" in p for p in problems(fed_copy))


def test_missing_files_and_count_mismatch(fed_copy: Path) -> None:
    first_sample(fed_copy, "D", "test").unlink()
    shutil.rmtree(fed_copy / "sites" / "E" / "val")
    found = problems(fed_copy)
    assert any("D/test: manifest says" in p for p in found)
    assert any("E/val: folder missing" in p for p in found)


def test_weak_label_problems(fed_copy: Path) -> None:
    weak = sorted((fed_copy / "sites" / "A" / "train" / "weak").glob("*.npy"))
    np.save(weak[0], np.full((32, 32), 9, np.uint8))
    np.save(weak[1].with_name("ghost.npy"), np.zeros((32, 32), np.uint8))
    weak[2].unlink()
    found = problems(fed_copy, labels="weak")
    assert any(
        "weak label values must be classes 0..2 or 255 (unlabeled), got [9]" in p for p in found
    )
    assert any("weak labels without a sample: ghost" in p for p in found)
    assert any(f"weak labels missing for {weak[2].stem}" in p for p in found)
    edit_manifest(fed_copy, lambda d: d.update(weak_labels=None))
    found = problems(fed_copy, labels="weak")
    assert sum("has no weak labels" in p for p in found) == 5
    assert not any("has no weak labels" in p for p in problems(fed_copy, labels="full"))


def test_empty_sites_and_splits(fed_copy: Path) -> None:
    def empty(d: dict) -> None:
        d["sites"][1]["splits"] = {"train": 0, "val": 0, "test": 0}
        d["sites"][2]["splits"]["train"] = 0

    edit_manifest(fed_copy, empty)
    found = problems(fed_copy)
    assert any("site 'B' has no samples in any split" in p for p in found)
    assert any("site 'C' has an empty train split" in p for p in found)


def test_require_valid_lists_every_problem(fed_copy: Path) -> None:
    first_sample(fed_copy, "D", "test").unlink()
    first_sample(fed_copy, "E", "test").unlink()
    with pytest.raises(DataError) as info:
        require_valid(fed_copy, batch_size=1)
    reason = info.value.reason
    assert "4 problem(s)" in reason  # per site: a count mismatch and an orphaned weak label
    assert "D/test: manifest says" in reason and "E/test: manifest says" in reason
    assert "D/test/weak: weak labels without a sample" in reason


@pytest.mark.parametrize("kind", ["npz", "npy"])
def test_every_single_byte_flip_or_cut_is_a_data_error_or_a_sample(tmp_path: Path, kind) -> None:
    """No damage at any position escapes as another exception (a traceback for the user)."""
    from fedseg.data.federation import image_problems, label_problems, read_npy, read_npz

    path = tmp_path / f"x.{kind}"
    if kind == "npz":
        np.savez(path, image=np.ones((1, 6, 6), np.float32), mask=np.ones((6, 6), np.uint8))
    else:
        np.save(path, np.ones((6, 6), np.uint8))
    raw = path.read_bytes()
    damaged = [raw[:n] for n in range(len(raw))]
    damaged += [raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1 :] for i in range(len(raw))]
    refused = 0
    for data in damaged:
        path.write_bytes(data)
        try:
            arrays = read_npz(path) if kind == "npz" else {"mask": read_npy(path)}
        except DataError as e:
            assert e.reason.startswith(f"{path}: ")
            refused += 1
            continue
        label_problems(arrays["mask"], (6, 6), 2)  # what survived is checkable
        if kind == "npz":
            image_problems(arrays["image"], (1, 6, 6))
    assert refused >= len(raw)  # every cut, at least


def test_what_the_contract_allows(fed_copy: Path) -> None:
    """Compressed archives, any integer mask dtype, z-scored intensities and extra arrays."""
    path = first_sample(fed_copy)
    with np.load(path) as z:
        image, mask = z["image"], z["mask"]
    zscored = ((image - image.mean()) / image.std() * 3).astype(np.float32)
    np.savez_compressed(path, image=zscored, mask=mask.astype(np.int32), note=np.arange(3))
    assert problems(fed_copy) == []
    split = FederatedDataset.open(fed_copy).load("C", "train")
    assert np.array_equal(split.images[0].numpy(), zscored)
    assert np.array_equal(split.masks[0].numpy(), mask)
