"""``flower-supernode`` with shorter waits, for federations on loopback.

A Flower 1.41 SuperNode that finds no message waits 3 s before it asks the SuperLink again,
checks for its ClientApp's reply every 0.5 s, and asks for the content of a message that is
still being uploaded again after 1 s, 2 s, ... (:mod:`~fedseg.engine.flower.pulls`). On
loopback, where a round is a few seconds of training, that waiting is most of the round.
``python -m fedseg.engine.flower.supernode POLL ARGS...`` runs ``flower-supernode ARGS...``
with every such wait capped at ``POLL`` seconds (content: first after ``POLL / 10``; more
requests to the SuperLink: meant for a few local sites, not for deployments, which keep
Flower's timing). It relies on the SuperNode loop of the pinned Flower version
(``flwr.supernode.start_client_internal`` sleeping through its ``time`` module and pulling
through its ``pull_objects``) and refuses to start if that module looks different.

``FEDSEG_NODE_HEARTBEAT=SECONDS`` (at least 10, the SuperLink's minimum) sets the heartbeat
interval the SuperNode announces (Flower's: 30 s). The SuperLink marks a node offline after
two missed intervals, so a site whose process died can rejoin after ~2 × SECONDS instead
of a minute. Unset: Flower's interval."""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any

from fedseg.engine.flower.pulls import quick_pulls

__all__ = ["HEARTBEAT_ENV", "CappedClock", "main", "set_heartbeat"]

HEARTBEAT_ENV = "FEDSEG_NODE_HEARTBEAT"
"""Environment variable: the SuperNode's heartbeat interval in seconds (>= 10)."""


class CappedClock:
    """The ``time`` module with ``sleep`` capped at ``cap`` seconds."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def set_heartbeat(seconds: float) -> None:
    """Make this process's SuperNode announce, and keep, a ``seconds`` heartbeat interval.

    Raises
    ------
    SystemExit
        If ``seconds`` is below the SuperLink's minimum or this Flower version's SuperNode
        does not read its interval where fedseg sets it.
    """
    import flwr.supercore.heartbeat as beat
    import flwr.supernode.fleet_http_connection as conn
    from flwr.common.constant import HEARTBEAT_MIN_INTERVAL

    if seconds < HEARTBEAT_MIN_INTERVAL:
        raise SystemExit(
            f"{HEARTBEAT_ENV} must be >= {HEARTBEAT_MIN_INTERVAL} (the SuperLink's minimum),"
            f" got {seconds:g}"
        )
    for mod in (conn, beat):
        if not isinstance(getattr(mod, "HEARTBEAT_DEFAULT_INTERVAL", None), int | float):
            raise SystemExit("this Flower version's SuperNode heartbeat is not one fedseg can tune")
        mod.HEARTBEAT_DEFAULT_INTERVAL = seconds  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    """``POLL ARGS...``: run ``flower-supernode ARGS...`` with waits capped at POLL seconds."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m fedseg.engine.flower.supernode POLL [ARGS...]")
    cap = float(args[0])
    import flwr.supernode.start_client_internal as loop
    from flwr.supernode.cli import flower_supernode

    if not isinstance(getattr(loop, "time", None), types.ModuleType):
        raise SystemExit("this Flower version's SuperNode loop is not the one fedseg can tune")
    try:
        pulls = quick_pulls(loop, "pull_objects", cap / 10, cap)
    except ValueError as e:
        raise SystemExit(
            f"this Flower version's SuperNode loop is not the one fedseg can tune: {e}"
        ) from None
    heartbeat = os.environ.get(HEARTBEAT_ENV, "").strip()
    if heartbeat:
        try:
            seconds = float(heartbeat)
        except ValueError:
            raise SystemExit(
                f"{HEARTBEAT_ENV} must be a number of seconds, got {heartbeat!r}"
            ) from None
        set_heartbeat(seconds)
    loop.time = CappedClock(cap)  # type: ignore[assignment]
    sys.argv = ["flower-supernode", *args[1:]]
    with pulls:
        flower_supernode()


if __name__ == "__main__":
    main()
