"""The server's side of every engine: the method, the global state, upload validation.

:class:`ServerCore` holds what the server keeps between rounds (per-site payloads, server
state) and runs the seeded server step. It never trusts an upload: each is checked against
the method's template (keys, dtypes, ranks and fixed dimensions, finite values) and against
the example count the site declared when it joined, before anything touches the model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch

from fedseg.config import RunConfig, method_config
from fedseg.engine.sites import derive_seed
from fedseg.engine.worker import initial_model
from fedseg.errors import ConfigError
from fedseg.methods import (
    FederationSpec,
    Method,
    Payload,
    ServerContext,
    SiteSpec,
    TrainSettings,
    get_method,
)
from fedseg.methods.base import Aggregator, payload_size, validate_payload
from fedseg.models import parse_model
from fedseg.privacy import private_method

__all__ = [
    "ServerCore",
    "build_spec",
    "make_method",
    "method_spec",
    "pooled_spec",
    "site_view",
    "spec_from_json",
    "spec_to_json",
]

log = logging.getLogger(__name__)

_TASK_KEYS = ("channels", "num-classes", "ndim", "ignore-index", "image-size")


def build_spec(
    labels: str, order: list[str], infos: Mapping[str, Mapping[str, Any]]
) -> FederationSpec:
    """The FederationSpec of the sites in ``order`` from their self-descriptions.

    Raises ConfigError when the sites disagree on the task (channels, classes, ...).
    """
    first = infos[order[0]]
    for name in order[1:]:
        diff = [k for k in _TASK_KEYS if _plain(infos[name][k]) != _plain(first[k])]
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
        labels=labels,
        sites=tuple(sites),
        image_size=tuple(int(v) for v in first["image-size"]),
    )


def spec_to_json(spec: FederationSpec) -> str:
    """The federation spec as JSON (sites in their global order)."""
    return json.dumps(asdict(spec))


def spec_from_json(text: str) -> FederationSpec:
    """Inverse of :func:`spec_to_json`."""
    raw = json.loads(text)
    sites = tuple(SiteSpec(**s) for s in raw.pop("sites"))
    image_size = tuple(raw.pop("image_size", ()))
    return FederationSpec(**raw, sites=sites, image_size=image_size)


def site_view(spec: FederationSpec, name: str) -> FederationSpec:
    """What site ``name`` is told of the federation: the task, the number of sites and its
    own entry; every other site only by its index (no name, size or annotation)."""
    sites = tuple(
        s if s.name == name else SiteSpec(f"#{s.index}", s.index, 0, "unknown", None)
        for s in spec.sites
    )
    return FederationSpec(**{**asdict(spec), "sites": sites})


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


def pooled_spec(spec: FederationSpec) -> FederationSpec:
    """The spec of pooled (centralized) training: one virtual site holding every sample."""
    from fedseg.engine.sites import POOLED

    pooled = SiteSpec(POOLED, 0, sum(s.num_train for s in spec.sites), "pooled", None)
    return FederationSpec(**{**asdict(spec), "sites": (pooled,), "pooled_sites": len(spec.sites)})


def method_spec(method_cls: type[Method], spec: FederationSpec) -> FederationSpec:
    """The spec a method sees: the real sites, or the one pooled site for CT."""
    return pooled_spec(spec) if method_cls.pooled else spec


def make_method(cfg: RunConfig, spec: FederationSpec) -> Method:
    """The configured method (with the configured network) for ``spec``."""
    cls = get_method(cfg.method_name)
    method = cls(method_config(cfg.method), method_spec(cls, spec), parse_model(cfg.model))
    return private_method(method, cfg.privacy, cfg.method_name)


class ServerCore:
    """Global state of one run and its seeded server step."""

    def __init__(self, method: Method, train: TrainSettings, seed: int) -> None:
        self.method, self.train, self.seed = method, train, seed
        self.model = initial_model(method, seed)
        self.upload_template = method.upload_template(self.model)
        init = method.init_server(self.model)
        self.payloads, self.state = init.payloads, init.state

    @property
    def spec(self) -> FederationSpec:
        return self.method.spec

    @property
    def params(self) -> dict[str, int]:
        """Trainable parameters of the model and of its uploaded and downloaded parts."""
        return self.method.parts(self.model).params()

    def check_upload(self, site: str, upload: Payload) -> None:
        """UploadError unless ``upload`` is what ``site`` may send."""
        declared = self.spec.site(site).num_train
        validate_payload(site, upload, self.upload_template, expected_examples=declared)

    def aggregator(self, r: int) -> Aggregator:
        """The method's aggregator for round ``r`` (generator seeded from (seed, round))."""
        gen = torch.Generator().manual_seed(derive_seed(self.seed, r, -1))
        return self.method.aggregator(self.state, ServerContext(self.spec, r, self.train, gen))

    def finish(self, agg: Aggregator) -> dict[str, Any]:
        """Close the round's aggregation: new payloads and server state; its metrics."""
        out = agg.finish()
        missing = [s for s in self.spec.site_names if s not in out.payloads]
        if missing:
            raise ConfigError(
                f"{type(self.method).__name__}.server_step gave no payload for {missing}"
            )
        self.payloads, self.state = out.payloads, out.state
        return out.metrics

    def download_size(self, site: str) -> dict[str, int]:
        return payload_size(self.payloads[site])

    def state_dict(self) -> dict[str, Any]:
        """Payloads (each distinct payload object stored once) and the server state."""
        unique: list[Payload] = []
        index: dict[str, int] = {}
        for site, p in self.payloads.items():
            pos = next((i for i, q in enumerate(unique) if q is p), None)
            if pos is None:
                unique.append(p)
                pos = len(unique) - 1
            index[site] = pos
        return {
            "payloads": [
                {"tensors": p.tensors, "metrics": p.metrics, "num_examples": p.num_examples}
                for p in unique
            ],
            "payload_of": index,
            "server_state": self.state,
        }

    def load_state_dict(self, ck: Mapping[str, Any]) -> None:
        unique = [Payload(**p) for p in ck["payloads"]]
        self.payloads = {s: unique[i] for s, i in ck["payload_of"].items()}
        self.state = ck["server_state"]
