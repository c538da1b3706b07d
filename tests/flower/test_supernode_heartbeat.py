"""FEDSEG_NODE_HEARTBEAT: the heartbeat interval fedseg's loopback SuperNode announces."""

from __future__ import annotations

import flwr.supercore.heartbeat as beat
import flwr.supernode.fleet_http_connection as conn
import pytest

from fedseg.engine.flower.supernode import set_heartbeat


def test_set_heartbeat_sets_the_interval_the_supernode_announces_and_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for mod in (conn, beat):
        monkeypatch.setattr(mod, "HEARTBEAT_DEFAULT_INTERVAL", mod.HEARTBEAT_DEFAULT_INTERVAL)
    set_heartbeat(12)
    assert conn.HEARTBEAT_DEFAULT_INTERVAL == 12 and beat.HEARTBEAT_DEFAULT_INTERVAL == 12


def test_a_heartbeat_below_the_superlinks_minimum_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for mod in (conn, beat):
        monkeypatch.setattr(mod, "HEARTBEAT_DEFAULT_INTERVAL", 30)
    with pytest.raises(SystemExit, match="must be >= 10"):
        set_heartbeat(5)
    assert conn.HEARTBEAT_DEFAULT_INTERVAL == 30
