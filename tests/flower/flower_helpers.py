"""Helpers of the Flower tests: tiny run configs and a direct (in-process) link to the sites.

:class:`DirectLink` drives the real site handlers in this process (no Flower processes), so
the protocol, validation and fault handling are tested fast; :class:`FakeGrid` is a scripted
Grid of :class:`Node` objects for the ServerApp's link; ``test_processes.py`` runs real
``flower-superlink`` / ``flower-supernode`` processes on loopback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from fedseg.config import RunConfig, parse_config
from fedseg.engine.flower.link import Reply
from fedseg.engine.flower.records import content, read_meta
from fedseg.engine.flower.server_app import GridLink
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig, run_config
from fedseg.engine.flower.site import handle_evaluate, handle_hello, handle_train
from fedseg.errors import FedsegError

HANDLERS = {"hello": handle_hello, "train": handle_train, "evaluate": handle_evaluate}
SITES = ["A", "B"]


def make_config(root: Path, method: str = "fedavg", rounds: int = 2, **extra: Any) -> RunConfig:
    """A tiny run: 2 rounds, 2 local iterations, batch 4, no augmentation, CPU."""
    raw = {
        "name": f"flower-{method}",
        "seed": 3,
        "data": {"root": str(root), "labels": "weak", "sites": SITES},
        "method": {"name": method},
        "train": {
            "rounds": rounds,
            "local_iters": 2,
            "batch_size": 4,
            "augment": False,
            "lr": 1e-3,
        },
        "eval": {"batch_size": 8},
        "engine": {"device": "cpu"},
        **extra,
    }
    return parse_config(raw)


class DirectLink:
    """A :class:`~fedseg.engine.flower.link.Transport` calling the site handlers directly.

    ``down`` holds sites that do not answer; ``down_in_round[r]`` sites that do not answer
    training messages of round ``r``; ``tamper[site]`` may rewrite a site's training reply.
    """

    def __init__(self, sites: Mapping[str, SiteConfig], rc: Mapping[str, Any]) -> None:
        self.sites, self.rc = dict(sites), dict(rc)
        self.down: set[str] = set()
        self.down_in_round: dict[int, set[str]] = {}
        self.tamper: dict[str, Callable[[RecordDict], RecordDict]] = {}
        self.tamper_eval: dict[str, Callable[[RecordDict], RecordDict]] = {}
        self.sent: list[tuple[str, str]] = []

    def _call(self, kind: str, site: str, body: RecordDict) -> Reply:
        r = read_meta(body).get("round")
        if site in self.down or (kind == "train" and site in self.down_in_round.get(r, ())):  # type: ignore[arg-type]
            return "no reply within 1s"
        self.sent.append((kind, site))
        try:
            reply = HANDLERS[kind](body, _node_config(self.sites[site]), self.rc)
        except FedsegError as e:
            return f"error: {e.reason}"
        fix = (self.tamper if kind == "train" else self.tamper_eval).get(site)
        return fix(reply) if fix and kind != "hello" else reply

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        out = {}
        for name in self.sites:
            reply = self._call("hello", name, content({"run-uid": run_uid}))
            if not isinstance(reply, str):
                out[name] = read_meta(reply)
        return out

    def exchange(
        self, kind: str, bodies: Mapping[str, RecordDict], timeout: float
    ) -> dict[str, Reply]:
        return {s: self._call(kind, s, b) for s, b in bodies.items()}


def _node_config(site: SiteConfig) -> dict[str, Any]:
    nc: dict[str, Any] = {"site-name": site.name, "data-dir": str(site.data_dir)}
    if site.state_dir is not None:
        nc["state-dir"] = str(site.state_dir)
    return nc


def direct_link(
    cfg: RunConfig, root: Path, run_dir: Path, **settings: Any
) -> tuple[DirectLink, FlowerSettings]:
    """A direct link to sites A and B (state under ``run_dir/sites``) and the settings."""
    st = FlowerSettings(run_dir=run_dir, poll_interval=0.01, join_timeout=0.05, **settings)
    sites = {n: SiteConfig(n, root, run_dir / "sites" / n) for n in SITES}
    return DirectLink(sites, run_config(cfg, st)), st


def hello_of(site: str) -> dict[str, Any]:
    """A valid hello of ``site`` (10 full-mask 32 px training samples, 1 channel, 2 classes)."""
    return {
        "site": site,
        "annotation": "full",
        "sparsity": "",
        "num-train": 10,
        "channels": 1,
        "num-classes": 2,
        "ndim": 2,
        "ignore-index": 255,
        "image-size": [32, 32],
        "fedseg-version": "0",
    }


@dataclass
class Node:
    node_id: int
    site: str
    name: str = ""
    """Name the node was registered under (empty: no registration)."""
    answers: bool = True
    online: bool = True
    hello: dict[str, Any] = field(default_factory=dict)
    """Fields of its hello that differ from :func:`hello_of`'s (None: left out)."""
    public_key: bytes = b""


def set_task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give messages the run and task ids that Flower sets in a ServerApp's process."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def grid_link(*nodes: Node) -> tuple[GridLink, FakeGrid]:
    """The ServerApp's link over a :class:`FakeGrid` of ``nodes`` (no polling delay)."""
    grid = FakeGrid(nodes)
    return GridLink(grid, poll_interval=0.0), grid  # type: ignore[arg-type]


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
                hello = {**hello_of(node.site), **node.hello}
                body: RecordDict = content({k: v for k, v in hello.items() if v is not None})
            elif node.site == "broken":
                out.append(
                    Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=msg)
                )
                continue
            else:
                body = content(read_meta(msg.content))
            out.append(Message(body, reply_to=msg))
        return out


def assert_same_metrics(ours: Mapping[str, Any], ref: Mapping[str, Any], tol: float) -> None:
    """Per-site ``{metric: {region: value}}`` equal within ``tol`` (NaN equals NaN)."""
    assert list(ours) == list(ref)
    for site, per in ref.items():
        for metric, regions in per.items():
            for region, v in regions.items():
                w = ours[site][metric][region]
                same = (math.isnan(v) and math.isnan(w)) or abs(w - v) <= tol
                assert same, f"{site} {metric} {region}: {w} != {v}"
