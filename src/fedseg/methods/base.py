"""The engine-neutral method contract: a client step, a server step, a partition.

A method never knows which engine runs it. The in-process runner and the Flower adapter
both build a :class:`ClientContext` / :class:`ServerContext` and call the same steps.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from fedseg.errors import UploadError
from fedseg.methods.partition import Partition, ResolvedPartition

__all__ = [
    "ClientContext",
    "ClientResult",
    "FederationSpec",
    "Method",
    "MethodConfig",
    "Payload",
    "ServerContext",
    "ServerResult",
    "SiteSpec",
    "State",
    "TrainSettings",
    "validate_upload",
]

State = dict[str, Any]
"""Private state of a site or of the server: tensors, numbers, strings, lists and dicts."""


class MethodConfig(BaseModel):
    """Base of every method's own settings (the YAML ``method:`` block minus ``name``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainSettings(BaseModel):
    """Local-training settings shared by all methods (the YAML ``train:`` block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = 10
    """Communication rounds."""
    local_iters: int = 10
    """Optimiser steps per site per round."""
    batch_size: int = 8
    optimizer: str = "adamw"
    """``adamw``, ``adam`` or ``sgd`` (momentum 0.9)."""
    lr: float = 1e-3
    weight_decay: float = 1e-4
    lr_schedule: str = "poly"
    """``poly`` (power 0.9 over rounds, as FedLPPA) or ``constant``."""
    augment: bool = True
    """Random flips, 90-degree rotations and intensity jitter on training batches."""
    loss: str = "auto"
    """``auto`` (pCE for weak labels, CE+Dice for full masks), ``pce``, ``ce_dice``,
    ``dice_bce`` (binary tasks)."""


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
    """What travels between server and site: named tensors plus numbers."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0


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
    """

    payloads: dict[str, Payload]
    state: State
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientContext:
    """Everything a client step may use besides its payload and private state.

    ``model`` is a workspace module shared by all sites of an engine; a step loads the
    weights it needs into it. ``batches`` yields (images, labels) training batches already on
    ``device``; ``val`` is the site's validation data (or ``None``).
    """

    site: SiteSpec
    spec: FederationSpec
    round: int
    train: TrainSettings
    model: nn.Module
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    device: torch.device
    generator: torch.Generator
    val: tuple[torch.Tensor, torch.Tensor] | None = None

    def lr(self) -> float:
        """Learning rate of this round under the configured schedule."""
        base = self.train.lr
        if self.train.lr_schedule == "poly":
            return base * (1 - self.round / max(self.train.rounds, 1)) ** 0.9
        return base


@dataclass
class ServerContext:
    """Everything a server step may use besides the uploads and its state."""

    spec: FederationSpec
    round: int
    train: TrainSettings
    generator: torch.Generator


class Method(ABC):
    """Base of every federated method.

    Subclasses set ``Config`` (their settings), ``partition`` (which weights travel), and
    implement :meth:`client_step` and :meth:`server_step`. Register with
    ``@register_method("name")``.
    """

    Config: ClassVar[type[MethodConfig]] = MethodConfig
    partition: ClassVar[Partition] = Partition()
    personalized: ClassVar[bool] = False
    """True when each site is evaluated with its own model."""
    pooled: ClassVar[bool] = False
    """True when the engine trains one virtual site on the union of all training data."""
    summary: ClassVar[str] = ""

    def __init__(self, config: MethodConfig, spec: FederationSpec) -> None:
        self.config = config
        self.spec = spec
        self._parts: ResolvedPartition | None = None

    # -- model and partition -------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """The network every site trains; overridden by methods with add-on modules."""
        from fedseg.models import UNet

        return UNet(self.spec.in_channels, self.spec.num_classes, ndim=self.spec.ndim)

    def parts(self, model: nn.Module) -> ResolvedPartition:
        """The partition resolved against ``model`` (cached)."""
        if self._parts is None:
            self._parts = self.partition.resolve(model)
        return self._parts

    def upload_template(self, model: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Expected upload tensors: name -> (shape, dtype). Methods with extras extend it."""
        state = model.state_dict()
        return {k: (tuple(state[k].shape), state[k].dtype) for k in self.parts(model).upload}

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

    # -- evaluation ------------------------------------------------------------------------
    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The model a site is evaluated with (default: payload weights + private weights)."""
        self.load(ctx.model, payload, state)
        return ctx.model

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


def validate_upload(
    site: str,
    upload: Payload,
    template: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
) -> None:
    """Raise :class:`UploadError` unless ``upload`` has exactly the template's keys, shapes
    and dtypes, finite values and a positive example count."""
    got, want = set(upload.tensors), set(template)
    if got != want:
        extra, lack = sorted(got - want), sorted(want - got)
        raise UploadError(f"site {site!r}: upload has unknown keys {extra[:3]}, lacks {lack[:3]}")
    for k, (shape, dtype) in template.items():
        t = upload.tensors[k]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise UploadError(
                f"site {site!r}: {k} should be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}"
            )
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise UploadError(f"site {site!r}: {k} has non-finite values")
    if upload.num_examples <= 0:
        raise UploadError(f"site {site!r}: num_examples must be > 0, got {upload.num_examples}")
    bad = [k for k, v in upload.metrics.items() if not math.isfinite(v)]
    if bad:
        raise UploadError(f"site {site!r}: non-finite metrics {bad}")
