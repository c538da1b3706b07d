"""The privacy tests over Flower reuse the Flower tests' helpers (tests/flower)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("flwr") is None:  # the `flower` extra is not installed
    collect_ignore_glob = ["test_*flower*.py"]
else:
    sys.path.insert(0, str(Path(__file__).parents[1] / "flower"))
