"""The ServerApp's link over Flower's Grid, with a scripted in-memory Grid."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pytest
from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedseg.engine.flower import server_app
from fedseg.engine.flower.records import content, read_meta
from fedseg.engine.flower.server_app import GridLink

pytestmark = pytest.mark.flower


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages take their run and task ids from the process (set by Flower in a ServerApp)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


@dataclass
class Node:
    node_id: int
    site: str
    name: str = ""
    """Name the node was registered under (empty: no registration)."""
    answers: bool = True
    online: bool = True


class FakeGrid:
    """Nodes answer hello with their site name and train with an echo of the envelope."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.inbox: dict[str, Message] = {}
        self.on_pull: Callable[[], None] | None = None

    def get_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.online]

    def get_node_ids(self) -> list[int]:
        return [n.node_id for n in self.get_nodes()]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id
            self.inbox[m.metadata.message_id] = m
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        if self.on_pull:
            self.on_pull()
        out = []
        for mid in list(ids):
            msg = self.inbox.get(mid)
            node = self.nodes[msg.metadata.dst_node_id] if msg else None
            if msg is None or node is None or not node.answers or not node.online:
                continue
            del self.inbox[mid]
            if msg.metadata.message_type == "query.hello":
                body: RecordDict = content({"site": node.site})
            elif node.site == "broken":
                out.append(
                    Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=msg)
                )
                continue
            else:
                body = content(read_meta(msg.content))
            out.append(Message(body, reply_to=msg))
        return out


def _link(*nodes: Node) -> tuple[GridLink, FakeGrid]:
    grid = FakeGrid(nodes)
    return GridLink(grid, poll_interval=0.0), grid  # type: ignore[arg-type]


def test_nodes_are_mapped_to_the_sites_they_introduce():
    link, _ = _link(Node(1, "A"), Node(2, "B"))
    assert sorted(link.announce("run")) == ["A", "B"]
    assert link.site_node == {"A": 1, "B": 2}
    replies = link.exchange("train", {"A": content({"x": 1}), "B": content({"x": 2})}, 5)
    assert {s: read_meta(r)["x"] for s, r in replies.items()} == {"A": 1, "B": 2}  # type: ignore[arg-type]


def test_a_node_claiming_another_registered_name_is_banned():
    link, _ = _link(Node(1, "A", name="A"), Node(2, "A", name="C"))
    assert link.announce("run") == {"A": {"site": "A"}}
    assert link.site_node == {"A": 1} and link.banned == {2}


def test_errors_timeouts_and_unknown_sites_become_reasons(monkeypatch: pytest.MonkeyPatch):
    link, grid = _link(Node(1, "A"), Node(2, "broken"), Node(3, "C"))
    link.announce("run")
    grid.nodes[3].answers = False
    bodies = {s: content({}) for s in ("A", "broken", "C", "D")}
    replies = link.exchange("train", bodies, timeout=0.05)
    assert not isinstance(replies["A"], str)
    assert replies["broken"] == "error 2: boom"
    assert replies["C"] == "no reply within 0s"
    assert replies["D"] == "not connected"


def test_a_restarted_site_replaces_its_dead_node_without_waiting(monkeypatch):
    monkeypatch.setattr(server_app, "LIVENESS_CHECK", 0.0)
    link, grid = _link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[2].answers = False  # B crashed: its node stays listed (heartbeat not expired)

    def restart_b() -> None:
        if 3 not in grid.nodes:
            grid.nodes[3] = Node(3, "B")

    grid.on_pull = restart_b
    replies = link.exchange("train", {"A": content({}), "B": content({})}, timeout=60)
    assert replies["B"] == "site restarted (node 2 replaced by node 3)"
    assert link.site_node == {"A": 1, "B": 3}


def test_offline_nodes_are_forgotten(monkeypatch):
    monkeypatch.setattr(server_app, "LIVENESS_CHECK", 0.0)
    link, grid = _link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[2].online = False
    replies = link.exchange("train", {"A": content({}), "B": content({})}, timeout=60)
    assert replies["B"] == "node disconnected"
    assert link.announce("run").keys() == {"A"}
