"""A site's side of a Flower run: its own data, its private state, the method's client steps.

Every message is answered by a :class:`~fedseg.engine.worker.SiteWorker` (the same class the
in-process engine uses) over this site's data, with the private state kept in files on the
site's disk (:class:`~fedseg.engine.site_state.SiteStateStore`). The handlers take and
return Flower ``RecordDict`` bodies and know nothing else about Flower, so tests can drive
them in-process.

A site process keeps what it has loaded (:data:`LOADED`): the runtime of its node and run
config and the workers of its last few runs (model, data, method), so a long-lived ClientApp
process (:mod:`~fedseg.engine.flower.executor`, or an actor of Flower's simulation engine)
pays for them once per run, not once per message. Every step still starts from the state in
the site's store, so results do not depend on what was loaded before.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from flwr.app import RecordDict

from fedseg.config import RunConfig, method_config
from fedseg.data import FederatedDataset
from fedseg.engine.device import resolve_device
from fedseg.engine.flower.records import (
    RESEND,
    PayloadCache,
    PayloadNotHeld,
    content,
    eval_record,
    read_meta,
    read_payload,
)
from fedseg.engine.flower.settings import SiteConfig, run_config_of
from fedseg.engine.server import spec_from_json
from fedseg.engine.site_state import SiteStateStore
from fedseg.engine.sites import load_sites
from fedseg.engine.worker import SiteWorker, initial_model
from fedseg.errors import ConfigError, DataError, UploadError
from fedseg.methods import FederationSpec, Method, get_method
from fedseg.methods.training import Precision
from fedseg.models import parse_model
from fedseg.privacy import private_method

__all__ = [
    "LOADED",
    "Loaded",
    "SiteRuntime",
    "fedseg_version",
    "handle_evaluate",
    "handle_hello",
    "handle_train",
    "method_for",
]


log = logging.getLogger(__name__)


def fedseg_version() -> str:
    """The installed fedseg version (sites and server should run the same one)."""
    try:
        return importlib.metadata.version("fedseg")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def method_for(cfg: RunConfig, spec: FederationSpec) -> Method:
    """The configured method for ``spec``; pooled methods cannot run as a federation."""
    cls = get_method(cfg.method_name)
    if cls.pooled:
        raise ConfigError(
            f"method {cfg.method_name!r} trains on the pooled data of all sites and cannot run "
            "as a federation; use `fedseg run` (in-process) for it"
        )
    method = cls(method_config(cfg.method), spec, parse_model(cfg.model))
    return private_method(method, cfg.privacy, cfg.method_name)


_RUN_UID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SiteRuntime:
    """One site of one run: ``cfg`` from the run config, ``site`` from the node config."""

    def __init__(self, cfg: RunConfig, site: SiteConfig) -> None:
        self.cfg, self.site = cfg, site
        self.device = resolve_device(site.device or cfg.engine.device)
        if site.threads:
            torch.set_num_threads(site.threads)

    def store(self, run_uid: str, keep: int = 2) -> SiteStateStore:
        if not _RUN_UID.fullmatch(run_uid):
            raise UploadError(f"invalid run id {run_uid!r}: expected letters, digits, '-' or '_'")
        return SiteStateStore(self.site.state_root / run_uid, keep)

    def describe(self) -> dict[str, Any]:
        """What the server may know about this site (no data): its SiteSpec and the task."""
        m = FederatedDataset.open(self.site.data_dir).manifest
        info = m.site(self.site.name)
        return {
            "site": info.name,
            "annotation": info.annotation,
            "sparsity": info.sparsity or "",
            "num-train": info.splits["train"],
            "channels": m.channels,
            "num-classes": m.num_classes,
            "ndim": m.ndim,
            "ignore-index": m.ignore_index,
            "image-size": list(m.spatial_shape),
            "fedseg-version": fedseg_version(),
        }

    def worker(self, spec: FederationSpec, run_uid: str, keep: int = 2) -> SiteWorker:
        """This site's worker for ``spec`` (its data with its global index, the method, the
        run's initial model, the state files of ``run_uid``)."""
        fed = FederatedDataset.open(self.site.data_dir)
        name = self.site.name
        _, sites = load_sites(fed, self.cfg.data.labels, [name], self.cfg.eval.split)
        data = sites[name]
        try:
            want = spec.site(name)
        except StopIteration:
            raise ConfigError(
                f"site {name!r} is not part of this run ({spec.site_names})"
            ) from None
        if (want.num_train, want.annotation) != (data.spec.num_train, data.spec.annotation):
            raise DataError(
                f"site {name!r}: the run was started with {want.num_train} {want.annotation!r} "
                f"training samples, the data folder now has {data.spec.num_train} "
                f"{data.spec.annotation!r}"
            )
        method = method_for(self.cfg, spec)
        return SiteWorker(
            method,
            replace(data, spec=want),
            train=self.cfg.train,
            seed=self.cfg.seed,
            device=self.device,
            model=initial_model(method, self.cfg.seed, self.device),
            store=self.store(run_uid, keep),
            regions=fed.manifest.regions,
            precision=Precision(self.cfg.engine.amp, self.cfg.engine.channels_last),
            eval_batch_size=self.cfg.eval.batch_size,
        )


class Loaded:
    """Site runtimes and workers kept between messages, keyed by everything they are built
    from; the least recently used beyond ``capacity`` are dropped."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self.runtimes: OrderedDict[str, SiteRuntime] = OrderedDict()
        self.workers: OrderedDict[tuple[str, str, str, int], SiteWorker] = OrderedDict()
        self.payloads = PayloadCache(capacity)
        """The payloads received last, for messages that name them by digest."""

    def _get(self, cache: OrderedDict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
        if key not in cache:
            cache[key] = build()
        cache.move_to_end(key)
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        return cache[key]

    @staticmethod
    def _key(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> str:
        return json.dumps([sorted(node_config.items()), sorted(run_config.items())], default=str)

    def runtime(self, node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> SiteRuntime:
        """The runtime of this node and run config (built on first use)."""
        site = SiteConfig.from_node_config(node_config)
        key = self._key(node_config, run_config)
        return self._get(self.runtimes, key, lambda: SiteRuntime(run_config_of(run_config), site))

    def worker(
        self,
        node_config: Mapping[str, Any],
        run_config: Mapping[str, Any],
        meta: Mapping[str, Any],
    ) -> SiteWorker:
        """The worker of this node's site for the run and site view in ``meta``."""
        rt = self.runtime(node_config, run_config)
        spec, run_uid, keep = str(meta["spec"]), str(meta["run-uid"]), int(meta["keep"])
        key = (self._key(node_config, run_config), spec, run_uid, keep)

        def load() -> SiteWorker:
            log.info("site %s: loading model, data and method of run %s", rt.site.name, run_uid)
            return rt.worker(spec_from_json(spec), run_uid, keep)

        return self._get(self.workers, key, load)


LOADED = Loaded()
"""What this process keeps loaded between messages."""


def _addressed(rt: SiteRuntime, meta: Mapping[str, Any]) -> None:
    if meta.get("site") != rt.site.name:
        raise UploadError(f"message for site {meta.get('site')!r} reached site {rt.site.name!r}")


def _resend(rt: SiteRuntime, meta: Mapping[str, Any]) -> RecordDict:
    """The reply asking for the payload that a message named by digest (e.g. after a restart
    of this process)."""
    log.info("site %s: asks for the payload of round %d again", rt.site.name, meta["round"])
    return content(
        {"run-uid": meta["run-uid"], "round": meta["round"], "site": rt.site.name, RESEND: True}
    )


def handle_hello(
    body: RecordDict, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> RecordDict:
    """Announce this site: its name and description, and the rounds it has state for."""
    rt = LOADED.runtime(node_config, run_config)
    meta = read_meta(body)
    info = rt.describe()
    info["state-rounds"] = rt.store(str(meta["run-uid"])).rounds()
    info["run-uid"] = meta["run-uid"]
    return content(info)


def handle_train(
    body: RecordDict, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> RecordDict:
    """One client step: payload in, upload (plus the step's metrics) out."""
    t0 = time.perf_counter()
    rt = LOADED.runtime(node_config, run_config)
    meta = read_meta(body)
    _addressed(rt, meta)
    r = int(meta["round"])
    try:
        payload = read_payload(body, LOADED.payloads)
    except PayloadNotHeld:
        return _resend(rt, meta)
    res, start = LOADED.worker(node_config, run_config, meta).train(r, payload)
    seconds = time.perf_counter() - t0
    log.info(
        "site %s: round %d done in %.1fs (state of round %d)",
        rt.site.name,
        r + 1,
        seconds,
        start + 1,
    )
    reply = {
        "run-uid": meta["run-uid"],
        "round": r,
        "site": rt.site.name,
        "from-round": start,
        "seconds": seconds,
    }
    return content(reply, payload=res.upload, train_metrics=res.metrics)


def handle_evaluate(
    body: RecordDict, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> RecordDict:
    """Evaluate this site's model on the requested split (test; val for the periodic
    evaluation); per-region metrics out."""
    rt = LOADED.runtime(node_config, run_config)
    meta = read_meta(body)
    _addressed(rt, meta)
    r = int(meta["round"])
    split = str(meta.get("split", "test"))
    try:
        payload = read_payload(body, LOADED.payloads)
    except PayloadNotHeld:
        return _resend(rt, meta)
    ev = LOADED.worker(node_config, run_config, meta).evaluate(r, payload, split=split)
    reply = {"run-uid": meta["run-uid"], "round": r, "site": rt.site.name}
    return content(reply, evaluation=eval_record(ev.metrics, ev.cases, ev.per_case))
