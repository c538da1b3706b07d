"""The engine-neutral method contract: a client step, a server step, a partition.

A method never knows which engine runs it. The in-process runner and the Flower adapter
both build a :class:`ClientContext` / :class:`ServerContext` and call the same steps.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from torch import nn

from fedseg.errors import ConfigError, UploadError
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.models.registry import ModelConfig, parse_model

__all__ = [
    "Aggregator",
    "Alternatives",
    "Batches",
    "ClientContext",
    "ClientResult",
    "CollectUploads",
    "FederationSpec",
    "Method",
    "MethodConfig",
    "Payload",
    "ServerContext",
    "ServerResult",
    "SiteSpec",
    "State",
    "Template",
    "TensorSpec",
    "TrainSettings",
    "aggregate",
    "batches_per_epoch",
    "payload_size",
    "round_lr",
    "round_steps",
    "template_of",
    "validate_payload",
    "validate_upload",
]

State = dict[str, Any]
"""Private state of a site or of the server: tensors, numbers, strings, lists and dicts."""

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]
"""(images, labels) training batches on the step's device."""


class TensorSpec(NamedTuple):
    """Expected shape and dtype of a payload tensor; ``None`` marks a variable dimension
    (e.g. the number of prototypes a site sends), checked only for its presence (rank).
    An ``optional`` tensor may be absent (e.g. MetaFed sends no teacher in some rounds)."""

    shape: tuple[int | None, ...]
    dtype: torch.dtype
    optional: bool = False

    def matches(self, t: torch.Tensor) -> bool:
        """True when ``t`` has this dtype, rank and every fixed dimension."""
        return (
            t.dtype == self.dtype
            and t.dim() == len(self.shape)
            and all(w is None or w == g for w, g in zip(self.shape, t.shape, strict=True))
        )

    def describe(self) -> str:
        dims = ", ".join("*" if d is None else str(d) for d in self.shape)
        return f"{self.dtype} [{dims}]"


Template = dict[str, TensorSpec]
"""Name -> expected :class:`TensorSpec` of every tensor of a payload."""


def template_of(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> Template:
    """The fixed-shape template of ``state``'s entries ``keys``."""
    return {k: TensorSpec(tuple(state[k].shape), state[k].dtype) for k in keys}


class Alternatives(BaseModel):
    """Settings where an optional field, once set, replaces another (``replaces``: optional
    field -> the one it replaces): setting both is an error, and a dump holds only the one in
    force, so that it parses again."""

    replaces: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _not_both(self) -> Alternatives:
        for option, other in self.replaces.items():
            if getattr(self, option) is not None and other in self.model_fields_set:
                raise ValueError(f"set {other} or {option}, not both")
        return self

    @model_serializer(mode="wrap")
    def _in_force(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for option, other in self.replaces.items():
            if getattr(self, option) is not None:
                data.pop(other, None)
        return data


class MethodConfig(Alternatives):
    """Base of every method's own settings (the YAML ``method:`` block minus ``name``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainSettings(Alternatives):
    """Local-training settings shared by all methods (the YAML ``train:`` block)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rounds: PositiveInt = 10
    """Communication rounds."""
    local_iters: PositiveInt = 10
    """Optimiser steps per site per round (unless ``local_epochs`` is set)."""
    local_epochs: PositiveInt | None = None
    """Passes over the site's training data per round instead of ``local_iters``: a site with
    n samples makes ``local_epochs * ceil(n / batch_size)`` steps (the last batch of a pass
    may be smaller), so sites of unequal size make unequal numbers of steps."""
    batch_size: PositiveInt = 8
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """``adamw``, ``adam`` or ``sgd`` (with ``momentum``)."""
    lr: PositiveFloat = 1e-3
    momentum: float = Field(0.9, ge=0, lt=1)
    """SGD momentum (0: plain SGD)."""
    weight_decay: float = Field(1e-4, ge=0)
    lr_schedule: Literal["poly", "constant", "cosine"] = "poly"
    """``poly`` (power 0.9 over rounds, as FedLPPA), ``constant`` or ``cosine`` (to 0)."""
    keep_optimizer_state: bool = False
    """Keep each site's optimiser state (momentum, Adam moments) across rounds in its private
    state, as FedBCS's and HarmoFL's code do (default: a fresh optimiser every round)."""
    augment: bool = True
    """Random flips, rotations and intensity jitter on training batches."""
    rotation: Literal["right_angles", "paper_45"] = "right_angles"
    """Rotations of ``augment``: ``right_angles`` (k x 90 degrees) or ``paper_45`` (any angle in
    [-45, 45] degrees, FedLPPA Sec. IV-A; corners rotated in are unlabeled)."""
    loss: Literal["auto", "pce", "ce_dice", "dice", "dice_foreground", "dice_bce"] = "auto"
    """``auto`` (pCE for weak labels, CE+Dice for full masks), ``pce``, ``ce_dice``,
    ``dice`` (soft Dice over all classes), ``dice_foreground`` (soft Dice over the classes
    but the background: with one foreground class, the Dice of its sigmoid channel, as
    FedDP's code trains), ``dice_bce`` (binary tasks)."""
    grad_clamp: PositiveFloat | None = None
    """Clamp every gradient element to [-v, v] before each optimiser step of the rounds
    (FedDP's code: 1.0); fine-tuning at evaluation does not clamp, as in that code. Not with
    ``privacy.mode: local``, whose DP-SGD clips per example."""

    replaces: ClassVar[dict[str, str]] = {"local_epochs": "local_iters"}


def batches_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches of one pass over ``num_samples`` samples (the last one may be smaller)."""
    return max(1, math.ceil(num_samples / max(1, min(batch_size, num_samples))))


@dataclass(frozen=True)
class SiteSpec:
    """What every party may know about a site: no data, only its description."""

    name: str
    index: int
    num_train: int
    annotation: str = "full"
    sparsity: str | None = None


@dataclass(frozen=True)
class FederationSpec:
    """The task and the participating sites, known to server and clients alike."""

    in_channels: int
    num_classes: int
    ndim: int
    ignore_index: int
    labels: str
    """``weak`` or ``full``."""
    sites: tuple[SiteSpec, ...]
    image_size: tuple[int, ...] = ()
    pooled_sites: int = 0
    """How many real sites were merged into the one pooled site (0: not pooled)."""

    @property
    def site_names(self) -> list[str]:
        return [s.name for s in self.sites]

    def site(self, name: str) -> SiteSpec:
        return next(s for s in self.sites if s.name == name)


@dataclass
class Payload:
    """What travels between server and site: named tensors plus numbers.

    Per-class vectors (prototypes) travel as a zero-filled ``[K, D]`` tensor plus an int64
    ``[K]`` count tensor: a class a site has not seen has count 0 and a zero row, never NaN.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0


def payload_size(payload: Payload) -> dict[str, int]:
    """What ``payload`` puts on the wire: tensor count, values, and bytes (tensor data plus
    8 bytes per number in ``metrics``; message framing is not counted)."""
    values = sum(t.numel() for t in payload.tensors.values())
    data = sum(t.numel() * t.element_size() for t in payload.tensors.values())
    return {
        "tensors": len(payload.tensors),
        "values": values,
        "bytes": data + 8 * len(payload.metrics),
    }


@dataclass
class ClientResult:
    """A client step's output: the upload, the site's new private state and its metrics."""

    upload: Payload
    state: State
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ServerResult:
    """A server step's output: one payload per site, the new server state and metrics.

    ``metrics`` may hold JSON-serialisable values (lists for matrices) for ``rounds.jsonl``.
    Payloads that are the same for several sites should be the same object: engines store
    and checkpoint such a payload once.
    """

    payloads: dict[str, Payload]
    state: State
    metrics: dict[str, Any] = field(default_factory=dict)


def round_lr(train: TrainSettings, round_index: int) -> float:
    """Learning rate of round ``round_index`` (0-based) under ``train``'s schedule."""
    base, t = train.lr, round_index / max(train.rounds, 1)
    if train.lr_schedule == "poly":
        return base * (1 - t) ** 0.9
    if train.lr_schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * t))
    return base


def round_steps(train: TrainSettings, num_train: int) -> int:
    """Optimiser steps of one round at a site with ``num_train`` training images."""
    if train.local_epochs is None:
        return train.local_iters
    return train.local_epochs * batches_per_epoch(num_train, train.batch_size)


@dataclass
class ClientContext:
    """Everything a client step may use besides its payload and private state.

    ``model`` is a workspace module shared by all sites of an engine; a step loads the
    weights it needs into it. ``batches`` yields shuffled (and, if configured, augmented)
    (images, labels) training batches already on ``device``, endlessly; :meth:`steps` says
    how many optimiser steps one round makes. :meth:`ordered_batches` is one ordered,
    un-augmented pass over the training data. ``val`` is the site's validation data (or
    ``None``). ``optimizer_state`` is managed by the engine: with ``keep_optimizer_state``,
    :func:`~fedseg.methods.training.train_steps` restores and saves it by parameter name.
    """

    site: SiteSpec
    spec: FederationSpec
    round: int
    train: TrainSettings
    model: nn.Module
    batches: Batches
    device: torch.device
    generator: torch.Generator
    val: tuple[torch.Tensor, torch.Tensor] | None = None
    ordered: Callable[[int], Batches] | None = None
    optimizer_state: dict[str, Any] = field(default_factory=dict)

    def lr(self) -> float:
        """Learning rate of this round under the configured schedule."""
        return round_lr(self.train, self.round)

    def steps(self) -> int:
        """Optimiser steps of one round: ``local_iters``, or ``local_epochs`` passes."""
        return round_steps(self.train, self.site.num_train)

    def ordered_batches(self, batch_size: int | None = None) -> Batches:
        """One pass over the training data in stored order, without augmentation."""
        if self.ordered is None:
            raise ConfigError(f"site {self.site.name!r}: this engine gives no ordered pass")
        return self.ordered(batch_size or self.train.batch_size)


@dataclass
class ServerContext:
    """Everything a server step may use besides the uploads and its state."""

    spec: FederationSpec
    round: int
    train: TrainSettings
    generator: torch.Generator


class Aggregator(Protocol):
    """How the server consumes one round's uploads: one at a time, as they arrive.

    The round loop feeds every valid upload to :meth:`add` (in the federation's site order)
    and then calls :meth:`finish` once. An aggregator that reduces each upload on arrival
    (a running average) keeps the server's memory independent of the number of sites.
    """

    def add(self, site: str, upload: Payload) -> None: ...

    def finish(self) -> ServerResult: ...


class CollectUploads:
    """The default aggregator: keep every upload, then run the method's server step."""

    def __init__(self, method: Method, state: State, ctx: ServerContext) -> None:
        self.method, self.state, self.ctx = method, state, ctx
        self.uploads: dict[str, Payload] = {}

    def add(self, site: str, upload: Payload) -> None:
        self.uploads[site] = upload

    def finish(self) -> ServerResult:
        return self.method.server_step(self.uploads, self.state, self.ctx)


def aggregate(agg: Aggregator, uploads: Mapping[str, Payload]) -> ServerResult:
    """Feed ``uploads`` to ``agg`` in their order and close the round: the server step of a
    method whose aggregator reduces uploads as they arrive."""
    for site, upload in uploads.items():
        agg.add(site, upload)
    return agg.finish()


class Method(ABC):
    """Base of every federated method.

    Subclasses set ``Config`` (their settings), ``partition`` (which weights travel), and
    implement :meth:`client_step` and :meth:`server_step`. Register with
    ``@register_method("name")``. ``model`` is the network the run's ``model:`` block chose
    (default: the UNet).
    """

    Config: ClassVar[type[MethodConfig]] = MethodConfig
    partition: ClassVar[Partition] = Partition()
    personalized: ClassVar[bool] = False
    """True when each site is evaluated with its own model."""
    pooled: ClassVar[bool] = False
    """True when the engine trains one virtual site on the union of all training data."""
    bf16_auto: ClassVar[bool] = True
    """Whether ``engine.amp: auto`` may train this method in bf16: False where the 3-seed
    float32/bf16 comparison moved the method by more than its seed spread
    (docs/benchmarks_speed.md). Methods not compared share the training loop of one that
    was (FedAvg's ``train_steps``) and follow it."""
    summary: ClassVar[str] = ""

    def __init__(
        self, config: MethodConfig, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        self.config = config
        self.spec = spec
        self.model_cfg = parse_model(model)
        self._parts: ResolvedPartition | None = None

    # -- model and partition -------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """The network every site trains (the ``model:`` block); methods with add-on
        modules override it."""
        s = self.spec
        return self.model_cfg.build(s.in_channels, s.num_classes, s.ndim)

    def unet_kwargs(self) -> dict[str, Any]:
        """UNet options of the ``model:`` block for methods that build UNet-based networks;
        ConfigError when the block names another network."""
        kwargs = getattr(self.model_cfg, "unet_kwargs", None)
        if kwargs is None:
            raise ConfigError(
                f"method {type(self).__name__} builds its own UNet-based network; "
                f"model.name must be unet, got {self.model_cfg.name!r}"
            )
        return dict(kwargs())

    def parts(self, model: nn.Module) -> ResolvedPartition:
        """The partition resolved against ``model`` (cached)."""
        if self._parts is None:
            self._parts = self.partition.resolve(model)
        return self._parts

    def upload_template(self, model: nn.Module) -> Template:
        """Expected upload tensors; methods that upload more than weights extend it."""
        return template_of(model.state_dict(), self.parts(model).upload)

    def download_template(self, model: nn.Module) -> Template:
        """Expected tensors of what the server sends a site; methods that send more than the
        partition's downloaded weights extend it."""
        return template_of(model.state_dict(), self.parts(model).download)

    # -- initial state ---------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        """Initial payload for every site (the downloaded part of ``model``) and state."""
        glob = ResolvedPartition.take(model.state_dict(), self.parts(model).download)
        payload = Payload(glob)
        return ServerResult({s.name: payload for s in self.spec.sites}, {})

    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        """Initial private state of ``site``: the private part of the initial model."""
        return {"weights": ResolvedPartition.take(model.state_dict(), self.parts(model).private)}

    # -- the two steps ---------------------------------------------------------------------
    @abstractmethod
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        """Local work of one site in one round."""

    @abstractmethod
    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        """Aggregate the uploads of the sites that replied into one payload per site."""

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        """The aggregator of one round (default: collect the uploads, then
        :meth:`server_step`); methods whose server step is a reduction override it."""
        return CollectUploads(self, state, ctx)

    # -- evaluation ------------------------------------------------------------------------
    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The model a site is evaluated with (default: payload weights + private weights)."""
        self.load(ctx.model, payload, state)
        return ctx.model

    def segment(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Label maps ``[N, *S]`` of ``images`` from the evaluation model (in eval mode).

        Default: arg-max over the output channels. Methods whose network outputs more
        channels than classes (e.g. virtual classes) override this one hook."""
        return model(images).argmax(1)

    # -- helpers for subclasses ------------------------------------------------------------
    def load(self, model: nn.Module, payload: Payload, state: State) -> None:
        """Load the downloaded and the private weights into ``model``."""
        weights = {**payload.tensors, **state.get("weights", {})}
        own = model.state_dict()
        missing = [k for k in own if k not in weights]
        if missing:
            raise UploadError(f"payload and private state lack {len(missing)} keys: {missing[:3]}")
        model.load_state_dict({k: weights[k] for k in own})

    def split(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], State]:
        """(upload tensors, private-weights state) taken from ``model``."""
        parts = self.parts(model)
        sd = model.state_dict()
        return parts.take(sd, parts.upload), {"weights": parts.take(sd, parts.private)}


def validate_payload(
    site: str,
    payload: Payload,
    template: Mapping[str, TensorSpec],
    *,
    what: str = "upload",
    expected_examples: int | None = None,
) -> None:
    """Raise :class:`UploadError` unless ``payload`` has exactly the template's keys, dtypes,
    ranks and fixed dimensions, finite values and finite metrics; an upload also needs a
    positive example count, equal to ``expected_examples`` when given (the count the site
    declared when it joined)."""
    got = set(payload.tensors)
    extra = sorted(got - set(template))
    lack = sorted(k for k, spec in template.items() if k not in got and not spec.optional)
    if extra or lack:
        raise UploadError(f"site {site!r}: {what} has unknown keys {extra[:3]}, lacks {lack[:3]}")
    for k, spec in template.items():
        if k not in got:
            continue
        t = payload.tensors[k]
        if not isinstance(t, torch.Tensor) or not spec.matches(t):
            got_desc = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t)
            raise UploadError(
                f"site {site!r}: {what} tensor {k} should be {spec.describe()}, got {got_desc}"
            )
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise UploadError(f"site {site!r}: {what} tensor {k} has non-finite values")
    bad = [k for k, v in payload.metrics.items() if not math.isfinite(v)]
    if bad:
        raise UploadError(f"site {site!r}: {what} has non-finite metrics {bad}")
    if what != "upload":
        return
    if payload.num_examples <= 0:
        raise UploadError(f"site {site!r}: num_examples must be > 0, got {payload.num_examples}")
    if expected_examples is not None and payload.num_examples != expected_examples:
        raise UploadError(
            f"site {site!r}: upload claims {payload.num_examples} examples, the site declared "
            f"{expected_examples} training samples when it joined"
        )


def validate_upload(
    site: str,
    upload: Payload,
    template: Mapping[str, TensorSpec],
    expected_examples: int | None = None,
) -> None:
    """:func:`validate_payload` for a site's upload."""
    validate_payload(site, upload, template, expected_examples=expected_examples)
