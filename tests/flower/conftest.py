"""Fixtures of the Flower tests: a tiny synthetic federation on disk (two sites, 32 px)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("flwr") is None:  # the `flower` extra is not installed
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two fundus-like sites, 32 px, weak labels, in one federation folder."""
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    root = tmp_path_factory.mktemp("fed") / "fundus"
    synthesize("fundus", root, sites=2, size=32, per_site=12, seed=0)
    generate_weak_labels(root, seed=0)
    return root


@pytest.fixture(scope="session")
def federation_with_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``federation``, with a validation split (for methods that need one)."""
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    root = tmp_path_factory.mktemp("fedval") / "fundus"
    synthesize("fundus", root, sites=2, size=32, per_site=12, seed=0, split=(0.6, 0.2, 0.2))
    generate_weak_labels(root, seed=0)
    return root
