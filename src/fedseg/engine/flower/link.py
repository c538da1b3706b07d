"""The round loop's :class:`~fedseg.engine.link.Link` over Flower messages.

:class:`FlowerLink` encodes payloads as Flower records, sends them through a transport (the
ServerApp's Grid, or a direct in-process transport in tests), and decodes every reply, never
trusting it: a reply with a wrong envelope (site, round, run id) or unreadable records is
that site's failure, with its reason. :func:`run_federation` runs one configured experiment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from flwr.app import RecordDict

from fedseg.config import RunConfig
from fedseg.engine.flower.records import (
    DIGEST,
    EVAL,
    META,
    RESEND,
    TRAIN_METRICS,
    Packed,
    content,
    pack_with_digest,
    read_eval,
    read_meta,
    read_metrics,
    read_payload,
)
from fedseg.engine.flower.secagg import SecureSum
from fedseg.engine.flower.settings import FlowerSettings
from fedseg.engine.flower.site import fedseg_version, method_for
from fedseg.engine.link import Failure
from fedseg.engine.loop import Federation, RoundCallback, RoundPolicy
from fedseg.engine.server import build_spec, parse_hello, site_view, spec_to_json
from fedseg.engine.worker import EvalReply, TrainReply
from fedseg.errors import ConfigError, UploadError
from fedseg.methods import FederationSpec, Method, Payload
from fedseg.privacy import CentralDP

__all__ = ["FlowerLink", "Reply", "Transport", "run_federation", "site_order"]

log = logging.getLogger(__name__)

Reply = RecordDict | str
"""A site's reply body, or the reason why there is none (timeout, error, disconnect)."""


class Transport(Protocol):
    """How Flower messages reach the sites (the Grid in deployment, direct calls in tests)."""

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        """Connected sites and their self-descriptions, ``{site name: description}``."""
        ...

    def exchange(
        self, kind: str, bodies: Mapping[str, RecordDict], timeout: float
    ) -> dict[str, Reply]:
        """Send ``bodies[site]`` to each site (``kind``: ``train`` or ``evaluate``); return the
        reply of every site, or why there is none."""
        ...


def site_order(cfg: RunConfig, settings: FlowerSettings) -> list[str]:
    """The declared sites in global-index order: ``--sites``, else ``data.sites``."""
    order = list(settings.sites or cfg.data.sites or [])
    if not order:
        raise ConfigError(
            "a Flower run needs its sites declared: set data.sites in the config or pass "
            "--sites A,B,... (their order fixes each site's index and random streams)"
        )
    if len(set(order)) != len(order):
        raise ConfigError(f"site list has duplicates: {order}")
    return order


class FlowerLink:
    """Sites that are Flower SuperNodes, reached through ``transport``."""

    engine = "flower"

    def __init__(self, transport: Transport, cfg: RunConfig, settings: FlowerSettings) -> None:
        self.transport, self.cfg, self.settings = transport, cfg, settings
        self.run_uid = ""
        self.views: dict[str, str] = {}
        self.held: dict[str, str] = {}
        """Digest of the payload each site received last and answered (settings.reuse)."""
        self._sent: dict[str, str] = {}
        self._version = fedseg_version()
        self._warned: set[str] = set()
        self.secure = cfg.privacy.secure_aggregation is not None
        """Training replies are summed by SecAgg+ (:meth:`train_sum`), never seen one by one."""
        self.weights: dict[str, float] = {}

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        """The connected sites whose description is valid (:func:`parse_hello`); each other
        site is left out, with a warning once per reason."""
        infos: dict[str, dict[str, Any]] = {}
        for s, info in self.transport.announce(run_uid).items():
            try:
                infos[s] = parse_hello(f"site {s!r}", info)
            except UploadError as e:
                if e.reason not in self._warned:
                    log.warning("ignoring an invalid introduction: %s", e.reason)
                    self._warned.add(e.reason)
        for s, info in infos.items():
            theirs = info.get("fedseg-version")
            if theirs != self._version and s not in self._warned:
                log.warning("site %r runs fedseg %s, the server %s", s, theirs, self._version)
                self._warned.add(s)
        return infos

    def federation(
        self, order: list[str], infos: Mapping[str, Mapping[str, Any]]
    ) -> FederationSpec:
        return build_spec(self.cfg.data.labels, order, infos)

    def bind(self, method: Method, run_uid: str) -> None:
        method_for(self.cfg, method.spec)  # refuses pooled methods with a clear error
        self.run_uid = run_uid
        self.views = {s: spec_to_json(site_view(method.spec, s)) for s in method.spec.site_names}
        self.weights = dict(method.weights) if isinstance(method, CentralDP) else {}

    def _body(
        self,
        site: str,
        r: int,
        payload: Payload,
        split: str = "test",
        held: str | None = None,
        packed: Packed | None = None,
    ) -> RecordDict:
        meta = {
            "run-uid": self.run_uid,
            "round": r,
            "site": site,
            "spec": self.views[site],
            "keep": self.cfg.engine.checkpoint_every + 1,
            "split": split,
        }
        return content(meta, payload=payload, held=held, packed=packed)

    def _check(self, site: str, r: int, body: RecordDict) -> dict[str, Any]:
        meta = read_meta(body)
        want = {"site": site, "round": r, "run-uid": self.run_uid}
        got = {k: meta.get(k) for k in want}
        if got != want:
            raise UploadError(f"reply envelope should be {want}, got {got}")
        return meta

    def _send(
        self, kind: str, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, Reply]:
        """Replies of the sites to ``payloads``; a payload a site holds (``self.held``) goes
        by digest, and again in full to a site that asks for it (it restarted)."""
        reuse = self.settings.reuse_payloads
        packed: dict[int, Packed] = {}
        for p in payloads.values():
            if id(p) not in packed:  # a payload shared by sites is packed (and hashed) once
                packed[id(p)] = pack_with_digest(p.tensors, reuse)
        bodies = {
            s: self._body(s, r, p, split, self.held.pop(s, "") if reuse else None, packed[id(p)])
            for s, p in payloads.items()
        }
        self._sent = {s: str(b[META].get(DIGEST, "")) for s, b in bodies.items()}
        replies = self.transport.exchange(kind, bodies, self.settings.round_timeout)
        again = [s for s, reply in replies.items() if _asks_again(reply)]
        if again:
            log.info("sending the payload again to %s (they do not hold it)", again)
            bodies = {
                s: self._body(s, r, payloads[s], split, "", packed[id(payloads[s])]) for s in again
            }
            replies |= self.transport.exchange(kind, bodies, self.settings.round_timeout)
        return replies

    def _answered(self, site: str) -> None:
        """``site`` answered the last message: it holds the payload that message named."""
        if self._sent.get(site):
            self.held[site] = self._sent[site]

    def train(self, r: int, payloads: Mapping[str, Payload]) -> dict[str, TrainReply | Failure]:
        out: dict[str, TrainReply | Failure] = {}
        for s, reply in self._send("train", r, payloads).items():
            if isinstance(reply, str):
                out[s] = reply
                continue
            try:
                meta = self._check(s, r, reply)
                upload = read_payload(reply)
            except UploadError as e:
                out[s] = f"rejected upload: {e.reason}"
                continue
            tm = reply.get(TRAIN_METRICS)
            metrics = read_metrics(tm) if tm is not None else {}  # type: ignore[arg-type]
            out[s] = TrainReply(upload, metrics, int(meta.get("from-round", -1)))
            self._answered(s)
        return out

    def train_sum(self, r: int, payloads: Mapping[str, Payload]) -> SecureSum:
        """One training round under secure aggregation: the fixed-weight sum of the sites'
        clipped updates, from Flower's SecAgg+ over the transport (a Grid)."""
        secure = getattr(self.transport, "secure_sum", None)
        if secure is None:
            raise ConfigError(
                "privacy.secure_aggregation needs a Flower Grid (fedseg flower run, "
                "engine.backend: flower-sim)"
            )
        first = next(iter(payloads.values()))
        keys = sorted(k for k, t in first.tensors.items() if t.is_floating_point())
        bodies = {s: self._body(s, r, p) for s, p in payloads.items()}
        settings = self.cfg.privacy
        return secure(bodies, self.weights, keys, r, settings, self.settings.round_timeout)

    def evaluate(
        self, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, EvalReply | Failure]:
        out: dict[str, EvalReply | Failure] = {}
        for s, reply in self._send("evaluate", r, payloads, split).items():
            if isinstance(reply, str):
                out[s] = reply
                continue
            try:
                self._check(s, r, reply)
                record = reply.get(EVAL)
                if record is None:
                    raise UploadError(f"reply has no {EVAL!r} record")
                out[s] = read_eval(record)  # type: ignore[arg-type]
                self._answered(s)
            except (UploadError, KeyError, ValueError, TypeError) as e:
                out[s] = f"invalid evaluation: {getattr(e, 'reason', e)}"
        return out

    def state_dict(self) -> dict[str, Any]:
        """Nothing: every site keeps its private state on its own disk."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


def _asks_again(reply: Reply) -> bool:
    """Whether ``reply`` asks for the payload again (the site does not hold its digest)."""
    if isinstance(reply, str):
        return False
    try:
        return read_meta(reply).get(RESEND) is True
    except UploadError:
        return False


def run_federation(
    cfg: RunConfig,
    settings: FlowerSettings,
    transport: Transport,
    *,
    engine: str = "flower",
    on_round: RoundCallback | None = None,
) -> dict[str, Any]:
    """Run (or resume) the experiment ``cfg`` over ``transport`` into ``settings.run_dir``;
    ``engine`` is recorded in results.json, ``on_round`` gets every round's record."""
    order = site_order(cfg, settings)
    policy = RoundPolicy(
        min_sites=settings.min_replies(len(order)),
        retries=settings.retries,
        join_timeout=settings.join_timeout,
        poll_interval=settings.poll_interval,
    )
    link = FlowerLink(transport, cfg, settings)
    link.engine = engine
    fed = Federation(cfg, link, settings.run_dir, order, policy)
    return fed.run(resume=settings.resume, on_round=on_round, overwrite=settings.overwrite)
