"""Fixtures of the data tests: tiny synthetic federations written to temporary folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels


@pytest.fixture(scope="session")
def fundus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only 5-site fundus federation (32 px, ~10 images per site) with weak labels."""
    root = tmp_path_factory.mktemp("fundus") / "fed"
    synthesize("fundus", root, size=32, per_site=10, seed=0)
    generate_weak_labels(root, seed=0)
    return root


@pytest.fixture
def fed_copy(fundus_root: Path, tmp_path: Path) -> Path:
    """A private, writable copy of ``fundus_root``."""
    return Path(shutil.copytree(fundus_root, tmp_path / "fed"))


def phantom(seed: int, size: int = 48, nested: bool = False, single: bool = False) -> np.ndarray:
    """Random ellipse mask: binary with one or two (possibly touching) objects, or one with
    ``single``, or a nested cup (1) in a rim (2)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((size, size), np.uint8)
    if nested:
        center = tuple(float(v) for v in rng.uniform(0.4, 0.6, 2) * size)
        axes = rng.uniform(0.25, 0.4, 2) * size
        angle = float(rng.uniform(0, 180))
        cv2.ellipse(mask, (center, tuple(axes), angle), 2, -1)
        cv2.ellipse(mask, (center, tuple(axes * rng.uniform(0.35, 0.6)), angle), 1, -1)
        return mask
    for _ in range(1 if single or rng.random() < 0.6 else 2):
        center = tuple(float(v) for v in rng.uniform(0.3, 0.7, 2) * size)
        axes = tuple(float(v) for v in rng.uniform(0.15, 0.35, 2) * size)
        cv2.ellipse(mask, (center, axes, float(rng.uniform(0, 180))), 1, -1)
    return mask
