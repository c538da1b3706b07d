"""``preview``: one PNG per site, also for volumes, full-mask sites and empty splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from fedseg.data import FederationWriter
from fedseg.data.preview import preview
from fedseg.errors import DataError


def test_preview_of_volumes_and_empty_split(tmp_path: Path) -> None:
    w = FederationWriter(
        tmp_path / "fed",
        task="t",
        class_names=["bg", "organ"],
        modality="MRI",
        channels=1,
        spatial_shape=(6, 16, 16),
    )
    mask = np.zeros((6, 16, 16), np.uint8)
    mask[2:4, 4:12, 4:12] = 1
    for i in range(2):
        w.add("A", "train", f"v{i}", mask[None].astype(np.float32), mask)
    w.add("B", "test", "v0", mask[None].astype(np.float32), mask)
    w.finish({"A": "full", "B": "full"})
    paths = preview(tmp_path / "fed", tmp_path / "png", n=4)
    assert [p.name for p in paths] == ["A.png", "B.png"]
    assert imread(paths[0]).shape[:2] == (440, 440)  # 2 samples x (image | mask), 220 px each
    assert imread(paths[1]).shape[:2] == (220, 440)  # B has no train samples: one empty row


def test_preview_default_folder_and_bad_split(fundus_root: Path, tmp_path: Path) -> None:
    paths = preview(fundus_root, tmp_path / "p", n=1, split="test")
    assert len(paths) == 5
    with pytest.raises(DataError, match=r"split must be one of"):
        preview(fundus_root, tmp_path / "p", split="holdout")
