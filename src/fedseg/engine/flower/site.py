"""A site's side of a Flower run: its own data, its private state, the method's client steps.

Every message starts a fresh ClientApp process, so each handler loads the site's data, builds
the method and the model, restores the private state from the site's disk, works, and saves
the new state before replying. The handlers take and return Flower ``RecordDict`` bodies and
know nothing else about Flower, so tests can drive them in-process.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from flwr.app import RecordDict

from fedseg.config import RunConfig, method_config
from fedseg.data import FederatedDataset
from fedseg.engine.flower.records import (
    content,
    eval_record,
    read_meta,
    read_payload,
    spec_from_json,
)
from fedseg.engine.flower.settings import SiteConfig, run_config_of
from fedseg.engine.flower.site_state import SiteStateStore
from fedseg.engine.runner import resolve_device
from fedseg.engine.simulation import evaluate_site
from fedseg.engine.sites import SiteData, client_context, load_sites
from fedseg.errors import ConfigError, DataError, UploadError
from fedseg.methods import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Method,
    Payload,
    State,
    get_method,
)

__all__ = [
    "SiteRuntime",
    "Step",
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
    return cls(method_config(cfg.method), spec)


@dataclass
class Step:
    """The inputs of one client step or evaluation on a site."""

    method: Method
    data: SiteData
    regions: dict[str, list[int]]
    store: SiteStateStore
    start: int
    """Round of the private state the step starts from (-1: the initial state)."""
    state: State
    ctx: ClientContext


_RUN_UID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SiteRuntime:
    """One site of one run: ``cfg`` from the run config, ``site`` from the node config."""

    def __init__(self, cfg: RunConfig, site: SiteConfig) -> None:
        self.cfg, self.site = cfg, site
        self.device = resolve_device(site.device or cfg.engine.device)
        if site.threads:
            torch.set_num_threads(site.threads)

    def store(self, run_uid: str) -> SiteStateStore:
        if not _RUN_UID.fullmatch(run_uid):
            raise UploadError(f"invalid run id {run_uid!r}: expected letters, digits, '-' or '_'")
        return SiteStateStore(self.site.state_root / run_uid)

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

    def load(self, spec: FederationSpec) -> tuple[Method, SiteData, dict[str, list[int]]]:
        """The method, this site's data (with its global index) and the evaluation regions."""
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
        return method_for(self.cfg, spec), replace(data, spec=want), fed.manifest.regions

    def model(self, method: Method) -> torch.nn.Module:
        """The workspace model, built from the run's seed exactly as the in-process engine."""
        torch.manual_seed(self.cfg.seed)
        return method.build_model().to(self.device)

    def state(
        self, method: Method, model: torch.nn.Module, store: SiteStateStore, r: int
    ) -> tuple[int, State]:
        """``(round, state)``: the newest saved state before round ``r``, or the initial one.

        The initial state repeats the in-process engine's start (``init_server``, then
        ``init_client`` of the sites in order) so that any random draws match it.
        """
        prev = store.latest_before(r)
        if prev is not None:
            return prev
        method.upload_template(model)
        method.init_server(model)
        for s in method.spec.sites:
            state = method.init_client(model, s)
            if s.name == self.site.name:
                return -1, state
        raise ConfigError(f"site {self.site.name!r} is not part of this run")

    def prepare(self, spec: FederationSpec, r: int, run_uid: str) -> Step:
        """Everything a step of round ``r`` needs, built as the in-process engine builds it."""
        method, data, regions = self.load(spec)
        model = self.model(method)
        store = self.store(run_uid)
        start, state = self.state(method, model, store, r)
        ctx = client_context(
            data, spec, self.cfg.train, round_index=r, seed=self.cfg.seed, model=model,
            device=self.device,
        )  # fmt: skip
        return Step(method, data, regions, store, start, state, ctx)

    def train(
        self, r: int, payload: Payload, spec: FederationSpec, run_uid: str, keep: int = 2
    ) -> tuple[ClientResult, int]:
        """Client step of round ``r``; saves the new private state before returning."""
        step = self.prepare(spec, r, run_uid)
        res = step.method.client_step(payload, step.state, step.ctx)
        step.store.save(r, res.state, keep)
        return res, step.start

    def evaluate(self, payload: Payload, spec: FederationSpec, run_uid: str) -> dict[str, Any]:
        """Score this site's test split with the model the method evaluates it with."""
        step = self.prepare(spec, self.cfg.train.rounds, run_uid)
        return evaluate_site(
            step.method, payload, step.state, step.data, step.ctx, step.regions,
            self.cfg.eval.batch_size,
        )  # fmt: skip


def _runtime(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> SiteRuntime:
    return SiteRuntime(run_config_of(run_config), SiteConfig.from_node_config(node_config))


def _addressed(rt: SiteRuntime, meta: Mapping[str, Any]) -> None:
    if meta.get("site") != rt.site.name:
        raise UploadError(f"message for site {meta.get('site')!r} reached site {rt.site.name!r}")


def handle_hello(
    body: RecordDict, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> RecordDict:
    """Announce this site: its name and description, and the rounds it has state for."""
    rt = _runtime(node_config, run_config)
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
    rt = _runtime(node_config, run_config)
    meta = read_meta(body)
    _addressed(rt, meta)
    r = int(meta["round"])
    res, start = rt.train(
        r,
        read_payload(body),
        spec_from_json(str(meta["spec"])),
        str(meta["run-uid"]),
        int(meta.get("keep", 2)),
    )
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
    """Evaluate this site's model on its test split; per-region metrics out."""
    rt = _runtime(node_config, run_config)
    meta = read_meta(body)
    _addressed(rt, meta)
    ev = rt.evaluate(read_payload(body), spec_from_json(str(meta["spec"])), str(meta["run-uid"]))
    reply = {"run-uid": meta["run-uid"], "round": int(meta["round"]), "site": rt.site.name}
    return content(reply, evaluation=eval_record(ev["metrics"], ev["cases"]))
