"""The server's side of a Flower run: the global state, upload validation, server steps.

:class:`Coordinator` holds what the in-process :class:`~fedseg.engine.simulation.Simulation`
holds on the server side (method, workspace model, upload template, per-site payloads, server
state) and runs the same seeded server step. It never trusts a reply: every upload is checked
against the method's template (keys, shapes, dtypes, finite values, example count) and a bad
one is dropped with its reason before anything touches the model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch
from flwr.app import RecordDict

from fedseg.config import RunConfig
from fedseg.engine.flower.records import (
    EVAL,
    TRAIN_METRICS,
    content,
    read_eval,
    read_meta,
    read_metrics,
    read_payload,
    spec_to_json,
)
from fedseg.engine.flower.site import method_for
from fedseg.engine.simulation import server_round
from fedseg.errors import ConfigError, UploadError
from fedseg.methods import FederationSpec, Payload, SiteSpec
from fedseg.methods.base import validate_upload

__all__ = ["Coordinator", "Reply", "build_spec"]

log = logging.getLogger(__name__)

Reply = RecordDict | str
"""A site's reply body, or the reason why there is none (timeout, error, disconnect)."""

_TASK_KEYS = ("channels", "num-classes", "ndim", "ignore-index", "image-size")


def build_spec(
    cfg: RunConfig, order: list[str], infos: Mapping[str, Mapping[str, Any]]
) -> FederationSpec:
    """The FederationSpec of the sites in ``order`` from their announcements.

    Raises ConfigError when the sites disagree on the task (channels, classes, ...).
    """
    first = infos[order[0]]
    for name in order[1:]:
        diff = [k for k in _TASK_KEYS if list_or(infos[name][k]) != list_or(first[k])]
        if diff:
            got = {k: (first[k], infos[name][k]) for k in diff}
            raise ConfigError(
                f"sites {order[0]!r} and {name!r} describe different tasks: {got} "
                "(all sites of a federation need the same channels, classes and image size)"
            )
    sites = tuple(
        SiteSpec(
            name,
            i,
            int(infos[name]["num-train"]),
            str(infos[name]["annotation"]),
            str(infos[name]["sparsity"]) or None,
        )
        for i, name in enumerate(order)
    )
    return FederationSpec(
        in_channels=int(first["channels"]),
        num_classes=int(first["num-classes"]),
        ndim=int(first["ndim"]),
        ignore_index=int(first["ignore-index"]),
        labels=cfg.data.labels,
        sites=sites,
        image_size=tuple(int(v) for v in first["image-size"]),
    )


def list_or(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


class Coordinator:
    """Global model state of one run and the server step, fed by site replies."""

    def __init__(self, cfg: RunConfig, spec: FederationSpec, run_uid: str, keep: int = 2) -> None:
        self.cfg, self.spec, self.run_uid, self.keep = cfg, spec, run_uid, keep
        self.method = method_for(cfg, spec)
        torch.manual_seed(cfg.seed)
        self.model = self.method.build_model()
        self.template = self.method.upload_template(self.model)
        init = self.method.init_server(self.model)
        self.payloads, self.server_state = init.payloads, init.state
        self._spec_json = spec_to_json(spec)

    @property
    def params(self) -> dict[str, int]:
        return self.method.parts(self.model).params()

    def body(self, site: str, r: int) -> RecordDict:
        """The message to ``site`` for round ``r`` (``r == train.rounds``: evaluation)."""
        meta = {
            "run-uid": self.run_uid,
            "round": r,
            "site": site,
            "spec": self._spec_json,
            "keep": self.keep,
        }
        return content(meta, payload=self.payloads[site])

    def _check(self, site: str, r: int, body: RecordDict) -> dict[str, Any]:
        meta = read_meta(body)
        want = {"site": site, "round": r, "run-uid": self.run_uid}
        got = {k: meta.get(k) for k in want}
        if got != want:
            raise UploadError(f"reply envelope should be {want}, got {got}")
        return meta

    def collect(
        self, r: int, replies: Mapping[str, Reply]
    ) -> tuple[dict[str, Payload], dict[str, dict[str, float]], dict[str, str]]:
        """Valid uploads and client metrics (in site order) and the failures with reasons."""
        uploads: dict[str, Payload] = {}
        metrics: dict[str, dict[str, float]] = {}
        failures: dict[str, str] = {}
        for s in self.spec.site_names:
            if s not in replies:
                continue
            reply = replies[s]
            if isinstance(reply, str):
                failures[s] = reply
                continue
            try:
                self._check(s, r, reply)
                upload = read_payload(reply)
                validate_upload(s, upload, self.template)
            except UploadError as e:
                log.warning("round %d: rejected the upload of site %r: %s", r + 1, s, e.reason)
                failures[s] = f"rejected upload: {e.reason}"
                continue
            uploads[s] = upload
            tm = reply.get(TRAIN_METRICS)
            metrics[s] = read_metrics(tm) if tm is not None else {}  # type: ignore[arg-type]
        return uploads, metrics, failures

    def step(self, r: int, uploads: Mapping[str, Payload]) -> dict[str, Any]:
        """The server step of round ``r`` on the valid uploads; returns its metrics."""
        out = server_round(
            self.method, uploads, self.server_state, r, self.cfg.train, self.cfg.seed
        )
        missing = [s for s in self.spec.site_names if s not in out.payloads]
        if missing:
            raise ConfigError(f"{self.cfg.method_name}.server_step gave no payload for {missing}")
        self.payloads, self.server_state = out.payloads, out.state
        return out.metrics

    def evaluations(self, replies: Mapping[str, Reply]) -> tuple[dict[str, Any], dict[str, str]]:
        """Per-site evaluations (in site order) and the failures with reasons."""
        per_site: dict[str, Any] = {}
        failures: dict[str, str] = {}
        r = self.cfg.train.rounds
        for s in self.spec.site_names:
            reply = replies.get(s)
            if reply is None:
                continue
            if isinstance(reply, str):
                failures[s] = reply
                continue
            try:
                self._check(s, r, reply)
                record = reply.get(EVAL)
                if record is None:
                    raise UploadError(f"reply has no {EVAL!r} record")
                per_site[s] = read_eval(record)  # type: ignore[arg-type]
            except (UploadError, KeyError, ValueError) as e:
                failures[s] = f"invalid evaluation: {getattr(e, 'reason', e)}"
        return per_site, failures

    def state_dict(self) -> dict[str, Any]:
        """Server-side checkpoint content (site-private states live on the sites)."""
        return {
            "payloads": {s: asdict(p) for s, p in self.payloads.items()},
            "server_state": self.server_state,
            "spec": self._spec_json,
            "run_uid": self.run_uid,
        }

    def load_state_dict(self, ck: Mapping[str, Any]) -> None:
        self.payloads = {s: Payload(**p) for s, p in ck["payloads"].items()}
        self.server_state = ck["server_state"]
