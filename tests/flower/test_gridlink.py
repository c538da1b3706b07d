"""The ServerApp's link over Flower's Grid, with a scripted in-memory Grid."""

from __future__ import annotations

import pytest
from flower_helpers import Node, grid_link, set_task_identity

from fedseg.engine.flower import server_app
from fedseg.engine.flower.records import content, read_meta

pytestmark = pytest.mark.flower


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    set_task_identity(monkeypatch)


def test_nodes_are_mapped_to_the_sites_they_introduce():
    link, _ = grid_link(Node(1, "A"), Node(2, "B"))
    assert sorted(link.announce("run")) == ["A", "B"]
    assert link.site_node == {"A": 1, "B": 2}
    replies = link.exchange("train", {"A": content({"x": 1}), "B": content({"x": 2})}, 5)
    assert {s: read_meta(r)["x"] for s, r in replies.items()} == {"A": 1, "B": 2}  # type: ignore[arg-type]


def test_a_node_claiming_another_registered_name_is_banned():
    link, _ = grid_link(Node(1, "A", name="A"), Node(2, "A", name="C"))
    assert link.announce("run").keys() == {"A"}
    assert link.site_node == {"A": 1} and link.banned == {2}


def test_errors_timeouts_and_unknown_sites_become_reasons(monkeypatch: pytest.MonkeyPatch):
    link, grid = grid_link(Node(1, "A"), Node(2, "broken"), Node(3, "C"))
    link.announce("run")
    grid.nodes[3].answers = False
    bodies = {s: content({}) for s in ("A", "broken", "C", "D")}
    replies = link.exchange("train", bodies, timeout=0.05)
    assert not isinstance(replies["A"], str)
    assert replies["broken"] == "error 2: boom"
    assert replies["C"] == "no reply within 0s"
    assert replies["D"] == "not connected"


def test_a_restarted_site_takes_over_once_its_dead_node_is_offline(monkeypatch):
    monkeypatch.setattr(server_app, "LIVENESS_CHECK", 0.0)
    link, grid = grid_link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[2].answers = False  # B crashed: its node stays listed (heartbeat not expired)
    grid.nodes[3] = Node(3, "B")  # B restarted as a new node: refused while node 2 is online
    assert link.announce("run").keys() == {"A", "B"}
    assert link.site_node["B"] == 2 and link.standby == {3: "B"}
    grid.nodes[2].online = False  # the heartbeat expired
    replies = link.exchange("train", {"A": content({}), "B": content({})}, timeout=60)
    assert replies["B"] == "node disconnected"
    link.announce("run")
    assert link.site_node == {"A": 1, "B": 3} and not link.standby


def test_offline_nodes_are_forgotten(monkeypatch):
    monkeypatch.setattr(server_app, "LIVENESS_CHECK", 0.0)
    link, grid = grid_link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[2].online = False
    replies = link.exchange("train", {"A": content({}), "B": content({})}, timeout=60)
    assert replies["B"] == "node disconnected"
    assert link.announce("run").keys() == {"A"}
