"""Shorter waits for message content still on its way (fedseg.engine.flower.pulls), on
Flower's own pull functions."""

from __future__ import annotations

import itertools
import time
import types

import pytest
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError
from flwr.superlink.grid import http_grid
from flwr.supernode import start_client_internal
from flwr.supernode.runtime import run_clientapp

from fedseg.engine.flower.pulls import quick_pulls

pytestmark = pytest.mark.flower


def _late(after: int) -> tuple[list[float], object]:
    """A pull_object_fn whose object is unavailable for the first ``after`` asks."""
    asks: list[float] = []

    def pull(object_id: str) -> bytes:
        asks.append(time.monotonic())
        if len(asks) <= after:
            raise ObjectUnavailableError(object_id)
        return b"content"

    return asks, pull


def test_quick_pulls_asks_again_after_the_first_wait_doubling_up_to_the_cap():
    module = types.ModuleType("fake")
    module.pull_objects = inflatable_utils.pull_objects  # type: ignore[attr-defined]
    asks, pull = _late(after=4)
    t0 = time.monotonic()
    with quick_pulls(module, "pull_objects", 0.01, 0.04):
        got = module.pull_objects(["x"], pull_object_fn=pull)  # type: ignore[attr-defined]
    elapsed = time.monotonic() - t0
    assert got == {"x": b"content"} and len(asks) == 5
    waits = [b - a for a, b in itertools.pairwise(asks)]
    # 0.01, 0.02, 0.04, 0.04 with Flower's +-20 % jitter (Flower itself: 1, 2, 4, 8 s)
    assert waits[0] < 0.05 and max(waits) < 0.1 and elapsed < 0.5
    assert module.pull_objects is inflatable_utils.pull_objects  # restored on exit


def test_quick_pulls_has_no_limit_on_the_number_of_asks():
    """Flower gives up after 500 asks; with waits of 10 ms that would be 5 s on a slow link."""
    module = types.ModuleType("fake")
    module.pull_objects = inflatable_utils.pull_objects  # type: ignore[attr-defined]
    asks, pull = _late(after=600)
    with quick_pulls(module, "pull_objects", 0.0001, 0.0001):
        got = module.pull_objects(["x"], pull_object_fn=pull)  # type: ignore[attr-defined]
    assert got == {"x": b"content"} and len(asks) == 601


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (http_grid, "pull_objects"),
        (start_client_internal, "pull_objects"),
        (run_clientapp, "pull_and_inflate_object_from_tree"),
    ],
)
def test_quick_pulls_fits_the_pulls_of_the_pinned_flower(module: types.ModuleType, name: str):
    """The ServerApp's Grid, the SuperNode loop and the ClientApp runtime pull through these."""
    original = getattr(module, name)
    with quick_pulls(module, name, 0.02, 0.2):
        assert getattr(module, name).keywords == {
            "initial_backoff": 0.02,
            "backoff_cap": 0.2,
            "max_tries_per_object": None,
        }
    assert getattr(module, name) is original


def test_quick_pulls_refuses_what_it_cannot_tune():
    module = types.ModuleType("fake")
    module.pull_objects = lambda ids: {}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"fake\.pull_objects"):
        quick_pulls(module, "pull_objects", 0.02, 0.2)
    with pytest.raises(ValueError, match=r"fake\.missing"):
        quick_pulls(module, "missing", 0.02, 0.2)
    with pytest.raises(ValueError, match="first <= cap"):
        quick_pulls(http_grid, "pull_objects", 0.5, 0.2)
