"""Shorter waits for the content of a message that is still on its way.

Flower 1.41 hands a message to its receiver as soon as the message itself has arrived,
before its content (the objects it is split into, e.g. the packed arrays): the SuperLink
gives a SuperNode a message while the ServerApp still uploads its arrays and the ServerApp a
reply while the SuperNode still uploads it, and a SuperNode gives its ClientApp a task
before it has downloaded the task's message. The receiver then asks for each missing
object again after 1 s, 2 s, 4 s, ... (at most 10 s, 500 times). On loopback, where the
content follows a few hundredths of a second later, those waits were most of a round's
wall time (1-3 s of a 5 s round, against 1.7 s of training). :func:`quick_pulls` makes one
of Flower's pull functions ask again after ``first`` seconds, doubling up to ``cap``, for as
long as Flower's time limit (2 h) allows.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import ModuleType
from typing import Any

__all__ = ["quick_pulls"]


def quick_pulls(
    module: ModuleType, name: str, first: float, cap: float
) -> AbstractContextManager[None]:
    """A context in which ``module.name`` (a Flower function that pulls objects with
    ``initial_backoff``, ``backoff_cap`` and ``max_tries_per_object``, looked up by name when
    it is called) waits ``first`` seconds before asking again for an object that is not
    there yet, doubling up to ``cap``, without a limit on the number of asks. ValueError
    (at once) if ``module.name`` is not such a function (another Flower version)."""
    if not 0 < first <= cap:
        raise ValueError(f"need 0 < first <= cap, got first={first}, cap={cap}")
    original = getattr(module, name, None)
    params = inspect.signature(original).parameters if callable(original) else {}
    if not {"initial_backoff", "backoff_cap", "max_tries_per_object"} <= set(params):
        raise ValueError(f"{module.__name__}.{name} is not a Flower object pull fedseg can tune")
    tuned = functools.partial(
        original, initial_backoff=first, backoff_cap=cap, max_tries_per_object=None
    )
    return _replaced(module, name, tuned)


@contextmanager
def _replaced(module: ModuleType, name: str, value: Callable[..., Any]) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
