"""The server's side of every engine: the method, the global state, upload validation.

:class:`ServerCore` holds what the server keeps between rounds (per-site payloads, server
state) and runs the seeded server step. It never trusts an upload: each is checked against
the method's template (keys, dtypes, ranks and fixed dimensions, finite values), against the
example count the site declared when it joined and against the invariants of its tensors
(BatchNorm variances and batch counters not negative), before anything touches the model.
A site's self-description (its hello over Flower) is checked field by field
(:func:`parse_hello`). The optional bounds of ``screening`` (:class:`ScreeningSettings`)
refuse a site that declares far more samples than the others and an upload whose update is
far larger than the round's median one.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedseg.config import RunConfig, ScreeningSettings, method_config
from fedseg.data.manifest import Annotation
from fedseg.engine.sites import derive_seed
from fedseg.engine.worker import TrainReply, initial_model
from fedseg.errors import ConfigError, UploadError
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
from fedseg.privacy import CentralDP, private_method
from fedseg.privacy.central import update_norm

__all__ = [
    "ServerCore",
    "build_spec",
    "make_method",
    "method_spec",
    "parse_hello",
    "pooled_spec",
    "site_view",
    "spec_from_json",
    "spec_to_json",
]

log = logging.getLogger(__name__)

_TASK_KEYS = ("channels", "num-classes", "ndim", "ignore-index", "image-size")
SPEC_KEYS = ("num-train", "annotation", "sparsity", *_TASK_KEYS)
"""The fields of a hello that make a site's entry in the federation (a site that joins again
must repeat them)."""
MAX_COUNT = 2**31 - 1
"""Largest sample count a hello may declare (an int32)."""
MAX_WIDTH = 4096
"""Largest channel or class count a hello may declare."""
MAX_SIDE = 65536
"""Largest image side (pixels or voxels) a hello may declare."""


class _Hello(BaseModel):
    """The fields of a hello, strictly typed (no ``"40"`` for 40, no float, no bool)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    site: str = Field(min_length=1, max_length=256)
    annotation: Annotation
    sparsity: Literal["", "sparse", "medium", "dense"]
    num_train: int = Field(alias="num-train", ge=1, le=MAX_COUNT)
    channels: int = Field(ge=1, le=MAX_WIDTH)
    num_classes: int = Field(alias="num-classes", ge=2, le=MAX_WIDTH)
    ndim: Literal[2, 3]
    ignore_index: int = Field(alias="ignore-index", ge=-MAX_COUNT, le=MAX_COUNT)
    image_size: list[int] = Field(alias="image-size", min_length=2, max_length=3)
    fedseg_version: str = Field("", alias="fedseg-version", max_length=256)
    state_rounds: list[int] = Field(default_factory=list, alias="state-rounds")


def parse_hello(node: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """``info``, a site's self-description, once every field is what a site sends: UploadError
    naming ``node`` (who sent it), the field, what was expected and what came otherwise."""
    try:
        hello = _Hello.model_validate(dict(info))
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "hello"
        got = f", got {err['input']!r:.80}" if err["type"] != "missing" else ""
        raise UploadError(f"{node}: hello field {field!r}: {err['msg']}{got}") from None
    bad = [v for v in hello.image_size if not 1 <= v <= MAX_SIDE]
    if len(hello.image_size) != hello.ndim or bad:
        raise UploadError(
            f"{node}: hello field 'image-size': expected {hello.ndim} sides in 1..{MAX_SIDE} "
            f"(ndim {hello.ndim}), got {hello.image_size!r}"
        )
    return dict(info)


def build_spec(
    labels: str, order: list[str], infos: Mapping[str, Mapping[str, Any]]
) -> FederationSpec:
    """The FederationSpec of the sites in ``order`` from their self-descriptions.

    Raises UploadError for a description with a missing or malformed field (naming the
    site) and ConfigError when the sites disagree on the task (channels, classes, ...).
    """
    infos = {name: parse_hello(f"site {name!r}", infos[name]) for name in order}
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


NON_NEGATIVE = frozenset({"running_var", "num_batches_tracked", "running_amp", "var"})
"""Names (last component of a key) of tensors that cannot hold negative values: BatchNorm
variances and batch counters, FedAP's uploaded variances, HarmoFL's amplitude spectrum."""


def check_invariants(site: str, upload: Payload) -> None:
    """UploadError when a tensor of ``upload`` breaks its own invariant (a negative variance)."""
    for k, t in upload.tensors.items():
        if k.rsplit(".", 1)[-1] in NON_NEGATIVE and bool((t < 0).any()):
            raise UploadError(
                f"site {site!r}: upload tensor {k} has negative values (min "
                f"{float(t.min()):.4g}); it cannot be below 0"
            )


def check_sample_counts(spec: FederationSpec, screening: ScreeningSettings) -> None:
    """ConfigError when a site declares more than ``screening.max_samples_ratio`` times the
    (lower) median declared training-sample count of the federation."""
    ratio = screening.max_samples_ratio
    if ratio is None or len(spec.sites) < 2:
        return
    median = statistics.median_low(s.num_train for s in spec.sites)
    for s in spec.sites:
        if s.num_train > ratio * median:
            raise ConfigError(
                f"site {s.name!r} declares {s.num_train} training samples, more than "
                f"screening.max_samples_ratio ({ratio:g}) x the median declared count "
                f"({median}): refused; raise the bound if the site is that large"
            )


class ServerCore:
    """Global state of one run and its seeded server step; ``screening`` holds the optional
    bounds on sample counts (checked here, for the federation) and update norms
    (:meth:`screen`)."""

    def __init__(
        self,
        method: Method,
        train: TrainSettings,
        seed: int,
        screening: ScreeningSettings | None = None,
    ) -> None:
        self.method, self.train, self.seed = method, train, seed
        self.screening = screening or ScreeningSettings()
        check_sample_counts(method.spec, self.screening)
        self.model = initial_model(method, seed)
        self.upload_template = method.upload_template(self.model)
        self.uploads_updates = isinstance(method, CentralDP)
        """Uploads are updates (central DP: clipped differences from the payload), not states."""
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
        if not self.uploads_updates:  # a variance's update may be negative
            check_invariants(site, upload)

    def update_norm(self, site: str, upload: Payload) -> float:
        """L2 norm of ``upload``'s floating-point tensors minus those of the payload ``site``
        was sent this round (a tensor the payload lacks counts whole); of the upload itself
        when it is an update (central DP)."""
        sent = {} if self.uploads_updates else self.payloads[site].tensors
        return update_norm(
            {
                k: t.double() - sent[k].double() if k in sent and sent[k].shape == t.shape else t
                for k, t in upload.tensors.items()
                if t.is_floating_point()
            }
        )

    def screen(
        self, replies: Iterable[tuple[str, TrainReply]], failures: dict[str, str]
    ) -> Iterator[tuple[str, TrainReply]]:
        """The valid training replies of a round that pass
        ``screening.max_update_norm_ratio``, each refused one into ``failures`` with its
        reason. Unset, replies pass as they come; set, the round's replies are held until
        all arrived (their lower median update norm is the reference)."""
        ratio = self.screening.max_update_norm_ratio
        if ratio is None:
            yield from replies
            return
        held = list(replies)
        norms = {s: self.update_norm(s, reply.upload) for s, reply in held}
        median = statistics.median_low(norms.values()) if norms else 0.0
        for s, reply in held:
            if norms[s] > ratio * median:
                reason = (
                    f"update norm {norms[s]:.4g} is over screening.max_update_norm_ratio "
                    f"({ratio:g}) x the round's median update norm ({median:.4g})"
                )
                log.warning("rejected the upload of site %r: %s", s, reason)
                failures[s] = f"rejected upload: {reason}"
                continue
            yield s, reply

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
