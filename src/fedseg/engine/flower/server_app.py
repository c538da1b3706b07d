"""The server side of a Flower run: the fedseg round loop over Flower's Grid (the
``ServerApp`` entry point that renders afterwards is :mod:`fedseg.flower_server_app`).

Sites are SuperNodes; the server knows them only by opaque node ids, so every new node is
asked to introduce itself (a ``query.hello`` message) and answers with its site name and
description, every field checked (:func:`~fedseg.engine.server.parse_hello`). Who may serve
a site:

* A node registered on the SuperLink under a name (``flwr supernode register --name``, the
  registration of SuperNode authentication) must claim exactly that site name, and the first
  such node binds the site to its registered public key for the life of this server: a node
  with another key is refused for that site, online or not.
* A second node claiming a site whose node is online is refused (kept waiting): it is greeted
  again once that node went offline, and may then take the site over (without
  authentication a site name is only a claim).
* A node that joins again (after a disconnect: with authentication under the same node id,
  without it under a new one) must describe its site as before (sample count, annotation,
  task); it then serves the site again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.superlink.grid import http_grid

from fedseg.engine.flower.link import Reply, run_federation
from fedseg.engine.flower.logs import configure_logging
from fedseg.engine.flower.pulls import quick_pulls
from fedseg.engine.flower.records import content, read_meta
from fedseg.engine.flower.secagg import SecureSum, secure_sum
from fedseg.engine.flower.settings import FlowerSettings, run_config_of
from fedseg.engine.server import SPEC_KEYS, parse_hello
from fedseg.errors import FedsegError, UploadError
from fedseg.privacy.settings import PrivacySettings

__all__ = ["GridLink", "run_on_grid"]

log = logging.getLogger(__name__)

MESSAGE_TYPES = {"hello": "query.hello", "train": "train", "evaluate": "evaluate"}
HELLO_TIMEOUT = 180.0
"""Seconds a new node has to introduce itself (it may install the app first)."""
HELLO_WAIT = 30.0
"""Seconds the server waits for new nodes' introductions before a round (late ones are
still accepted while the round runs, for the next round)."""
HELLO_RETRY = 60.0
"""Seconds before a node that did not answer its hello is asked again."""
LIVENESS_CHECK = 5.0
"""Seconds between checks whether nodes with pending messages are still online."""


class GridLink:
    """The :class:`~fedseg.engine.flower.link.Transport` over a Flower ``Grid``.

    New nodes are greeted (``query.hello``) whenever the server looks for sites, also while
    it waits for a round's replies: a site whose node went offline is served by the node that
    claims it next (the same node coming back, or a restarted site's new node), and the
    replies the old node owed fail at once instead of at the round timeout.
    """

    def __init__(self, grid: Grid, poll_interval: float = 0.5) -> None:
        self.grid = grid
        self.poll = poll_interval
        self.run_uid = ""
        self.site_node: dict[str, int] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.banned: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.gone: dict[int, str] = {}
        """Why a node no longer serves its site (for the replies it still owes)."""
        self.keys: dict[str, bytes] = {}
        """Site -> the registered public key bound to it (SuperNode authentication)."""
        self.standby: dict[int, str] = {}
        """Node -> the site it claims, served by another node that is still online."""
        self._hellos: dict[str, tuple[int, float, Any]] = {}
        """Pending hello message id -> (node id, deadline, node info)."""

    # -- discovery ---------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Forget offline nodes and greet new ones."""
        online = {n.node_id: n for n in self.grid.get_nodes()}
        for site, nid in list(self.site_node.items()):
            if nid not in online:
                log.warning("site %r (node %d) went offline", site, nid)
                self.gone[nid] = "node disconnected"
                del self.site_node[site]
        for nid, site in list(self.standby.items()):
            if nid not in online or site not in self.site_node:
                del self.standby[nid]  # the site is free: greeted again below
        waiting = {nid for nid, _, _ in self._hellos.values()}
        known = set(self.site_node.values()) | self.banned | waiting | set(self.standby)
        now = time.monotonic()
        new = [n for n in online if n not in known and self.retry_at.get(n, 0) <= now]
        if not new:
            return
        body = content({"run-uid": self.run_uid})
        msgs = [Message(body, dst_node_id=n, message_type=MESSAGE_TYPES["hello"]) for n in new]
        for nid, mid in zip(new, self.grid.push_messages(msgs), strict=True):
            if mid:
                self._hellos[mid] = (nid, now + HELLO_TIMEOUT, online[nid])

    def _introduce(self, nid: int, reply: Reply, node: Any) -> None:
        if isinstance(reply, str):
            log.warning("node %d did not introduce itself: %s", nid, reply)
            if reply.startswith("no reply"):
                self.retry_at[nid] = time.monotonic() + HELLO_RETRY
            else:
                self.banned.add(nid)
            return
        try:
            info = parse_hello(f"node {nid}", read_meta(reply))
        except UploadError as e:
            log.warning("node %d sent an invalid introduction: %s", nid, e.reason)
            self.banned.add(nid)
            return
        site = info["site"]
        refused = self._refusal(site, node, info)
        if refused:
            log.error("node %d claims site %r: %s; ignored", nid, site, refused)
            self.banned.add(nid)
            return
        old = self.site_node.get(site)
        if old is not None and old != nid:
            log.warning(
                "node %d claims site %r, which node %d serves: refused while node %d is online",
                nid,
                site,
                old,
                old,
            )
            self.standby[nid] = site
            return
        key = _registered_key(node)
        if key is not None:
            self.keys[site] = key
        again = site in self.infos
        log.info("site %r %s as node %d", site, "joined again" if again else "joined", nid)
        self.gone.pop(nid, None)
        self.site_node[site] = nid
        self.infos[site] = info

    def _refusal(self, site: str, node: Any, info: Mapping[str, Any]) -> str:
        """Why ``node`` may not serve ``site`` at all ('' when it may)."""
        registered = getattr(node, "name", "")
        if registered and registered != site:
            return f"it is registered as {registered!r}"
        bound = self.keys.get(site)
        if bound is not None and _registered_key(node) != bound:
            return "the site is bound to the registered key of the node that joined first"
        before = self.infos.get(site, info)
        changed = {k: (before[k], info[k]) for k in SPEC_KEYS if before[k] != info[k]}
        if changed:
            return f"it describes the site otherwise than when it joined: {changed}"
        return ""

    def _pull(self, pending: dict[str, int]) -> dict[int, Reply]:
        """Replies to ``pending`` work messages (removed from it); handles hello replies."""
        ids = [*pending, *self._hellos]
        got: dict[int, Reply] = {}
        for msg in self.grid.pull_messages(ids) if ids else []:
            mid = msg.metadata.reply_to_message_id
            if mid in self._hellos:
                nid, _, node = self._hellos.pop(mid)
                self._introduce(nid, _reply_of(msg), node)
            elif mid in pending:
                got[pending.pop(mid)] = _reply_of(msg)
        now = time.monotonic()
        for mid, (nid, until, node) in list(self._hellos.items()):
            if now > until:
                del self._hellos[mid]
                self._introduce(nid, f"no reply within {HELLO_TIMEOUT:.0f}s", node)
        return got

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        self.run_uid = run_uid
        self._refresh()
        until = time.monotonic() + HELLO_WAIT
        while self._hellos and time.monotonic() < until:
            self._pull({})
            if self._hellos:
                time.sleep(self.poll)
        return {s: self.infos[s] for s in self.site_node}

    # -- work --------------------------------------------------------------------------------
    def exchange(
        self, kind: str, bodies: Mapping[str, RecordDict], timeout: float
    ) -> dict[str, Reply]:
        nodes = {s: self.site_node[s] for s in bodies if s in self.site_node}
        out: dict[str, Reply] = {s: "not connected" for s in bodies if s not in nodes}
        msgs = [
            Message(bodies[s], dst_node_id=n, message_type=MESSAGE_TYPES[kind])
            for s, n in nodes.items()
        ]
        pending: dict[str, int] = {}
        for (s, nid), mid in zip(nodes.items(), self.grid.push_messages(msgs), strict=True):
            if mid:
                pending[mid] = nid
            else:
                out[s] = "message could not be sent"
        replies: dict[int, Reply] = {}
        deadline = time.monotonic() + timeout
        checked = time.monotonic()
        while pending and time.monotonic() < deadline:
            replies.update(self._pull(pending))
            if time.monotonic() - checked > LIVENESS_CHECK:
                checked = time.monotonic()
                self._refresh()
            serving = set(self.site_node.values())
            for mid, nid in list(pending.items()):
                if nid not in serving:
                    replies[nid] = self.gone.get(nid, "node disconnected")
                    del pending[mid]
            if pending:
                time.sleep(self.poll)
        for nid in pending.values():
            replies[nid] = f"no reply within {timeout:.0f}s"
        for s, nid in nodes.items():
            out.setdefault(s, replies.get(nid, "no reply"))
            if isinstance(out[s], str) and "unavailable" in out[s] and self.site_node.get(s) == nid:
                del self.site_node[s]
        return out

    def secure_sum(
        self,
        bodies: Mapping[str, RecordDict],
        weights: Mapping[str, float],
        keys: list[str],
        r: int,
        settings: PrivacySettings,
        timeout: float,
    ) -> SecureSum:
        """One SecAgg+ round of the connected sites among ``bodies`` over the Grid."""
        nodes = {s: self.site_node[s] for s in bodies if s in self.site_node}
        return secure_sum(self.grid, bodies, nodes, weights, keys, r, settings, timeout)


def _registered_key(node: Any) -> bytes | None:
    """The public key of a node registered under a name (``flwr supernode register --name``,
    SuperNode authentication); None for an unnamed node, whose key proves nothing."""
    key = getattr(node, "public_key", b"")
    return bytes(key) if getattr(node, "name", "") and key else None


def _reply_of(msg: Message) -> Reply:
    if not msg.has_error():
        return msg.content
    code = msg.error.code
    what = "node unavailable" if code == ErrorCode.NODE_UNAVAILABLE else f"error {code}"
    return f"{what}: {msg.error.reason}"


def run_on_grid(grid: Grid, context: Context) -> tuple[Path, dict[str, Any]]:
    """Run the fedseg experiment carried by the run config over ``grid``; returns the run
    directory and ``results.json``'s content. A reply whose content is still being uploaded
    is asked for again at the poll interval, not after Flower's 1-10 s
    (:mod:`~fedseg.engine.flower.pulls`)."""
    settings = FlowerSettings.from_run_config(context.run_config)
    configure_logging(settings.run_dir)
    poll = settings.poll_interval
    try:
        cfg = run_config_of(context.run_config)
        with quick_pulls(http_grid, "pull_objects", poll / 10, poll):
            results = run_federation(cfg, settings, GridLink(grid, poll))
    except FedsegError as e:
        log.error("run failed: %s", e.reason)
        raise
    return settings.run_dir, results
