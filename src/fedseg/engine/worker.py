"""A site's side of every engine: its data, its private state, the method's client steps.

The in-process engine holds one :class:`SiteWorker` per site (all sharing one workspace
model); a Flower site process holds one for itself. Either way a client step of round ``r``
starts from the newest private state saved before round ``r`` (or the initial one) and runs
with every random stream derived from (seed, round, site index), so it gives the same result
in every engine, in any process, after any resume.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from fedseg.engine.sites import SiteData, client_context, derive_seed, seeded
from fedseg.errors import FedsegError
from fedseg.evaluation import evaluate
from fedseg.methods import ClientContext, ClientResult, Method, Payload, TrainSettings
from fedseg.methods.base import Template, validate_payload
from fedseg.methods.training import Precision, precision

__all__ = [
    "RELEASED",
    "EvalReply",
    "MemoryStore",
    "SiteWorker",
    "StateStore",
    "TrainReply",
    "check_download",
    "initial_model",
]

SiteState = dict[str, Any]
"""What a site keeps between rounds: ``{"method": private state, "optimizer": {...}}``."""

RELEASED = "released"
"""Passed as ``initial`` where the site's state before round 1 was released (its store holds
a newer state, set before the first step)."""


class StateStore(Protocol):
    """Where a site keeps its private state between rounds."""

    replays: bool
    """Whether a step may start from before the newest save (a server that resumes from an
    older checkpoint replays rounds). A store that cannot lets the site release its initial
    state after the first save."""

    def latest_before(self, r: int) -> tuple[int, SiteState] | None:
        """``(round, state)`` saved after the newest round before ``r``, or None."""
        ...

    def save(self, r: int, state: SiteState) -> None:
        """Keep ``state`` as the state after round ``r``."""
        ...


class MemoryStore:
    """The newest state of a site, in memory (the in-process engine; checkpointed by it)."""

    replays = False

    def __init__(self) -> None:
        self.saved: tuple[int, SiteState] | None = None

    def latest_before(self, r: int) -> tuple[int, SiteState] | None:
        if self.saved is not None and self.saved[0] >= r:
            raise FedsegError(
                f"in-memory site state is of round {self.saved[0] + 1}, a step of round "
                f"{r + 1} cannot start from it"
            )
        return self.saved

    def save(self, r: int, state: SiteState) -> None:
        self.saved = (r, state)


@dataclass
class TrainReply:
    """A site's answer to a training request."""

    upload: Payload
    metrics: dict[str, float] = field(default_factory=dict)
    from_round: int = -1
    """Round of the private state the step started from (-1: the initial state)."""


@dataclass
class EvalReply:
    """A site's evaluation: ``{metric: {region: mean}}`` over ``cases`` test cases."""

    metrics: dict[str, dict[str, float]]
    cases: int
    per_case: list[dict[str, Any]] = field(default_factory=list)


_CHECKED: dict[int, tuple[weakref.ref[Payload], Template]] = {}
"""Download payloads already validated in this process (by identity), with their template."""


def check_download(site: str, payload: Payload, template: Template) -> None:
    """:func:`validate_payload` of a download, once per payload object and template: a payload
    the server shares among sites (FedAvg's global model) is checked once, not per site."""
    key = id(payload)
    seen = _CHECKED.get(key)
    if seen is not None and seen[0]() is payload and seen[1] is template:
        return
    validate_payload(site, payload, template, what="download")
    _CHECKED[key] = (weakref.ref(payload, lambda _, key=key: _CHECKED.pop(key, None)), template)


def initial_model(method: Method, seed: int, device: torch.device | str = "cpu") -> nn.Module:
    """The method's network with the run's initial weights: the same in every engine."""
    with seeded(seed):
        return method.build_model().to(device)


class SiteWorker:
    """One site's client steps and evaluations for ``method``.

    ``model`` is the workspace network (initial weights from :func:`initial_model`);
    ``regions`` and ``eval_batch_size`` configure evaluation; ``initial`` is the site's state
    before round 1 when another process computed it (:data:`RELEASED`: no longer needed).
    """

    def __init__(
        self,
        method: Method,
        data: SiteData,
        *,
        train: TrainSettings,
        seed: int,
        device: torch.device,
        model: nn.Module,
        store: StateStore,
        regions: Mapping[str, Sequence[int]],
        eval_batch_size: int,
        download: Template | None = None,
        initial: SiteState | str | None = None,
        precision: Precision | None = None,
    ) -> None:
        self.method, self.data, self.train_cfg = method, data, train
        self.precision = (precision or Precision()).resolve(
            method.model_cfg, method.spec.ndim, device, method.bf16_auto
        )
        """Autocast and memory format of this site's forwards (``engine.amp``,
        ``engine.channels_last``, ``auto`` resolved for the network and device)."""
        self.seed, self.device, self.model, self.store = seed, device, model, store
        self.regions, self.eval_batch_size = dict(regions), eval_batch_size
        self.download = download if download is not None else method.download_template(model)
        if initial is None:
            with seeded(derive_seed(seed, -1, data.spec.index), device):
                initial = {"method": method.init_client(model, data.spec), "optimizer": {}}
        self.initial: SiteState | None = None if isinstance(initial, str) else initial
        """The state before round 1, taken from the initial model before any training (or
        ``initial``: the one another process took); None once released (a store that does
        not replay holds a newer one), so that memory holds one state per site."""
        self.kept: dict[str, nn.Module] | None = None
        """When a dict: each test evaluation keeps a CPU copy of the model it scored, by site
        name, so that the run's final models can be exported without building them again
        (a fine-tuning ``eval_model`` would repeat its fine-tuning)."""

    def _precision(self) -> AbstractContextManager[Precision]:
        return precision(self.precision.amp, self.precision.channels_last)

    @property
    def name(self) -> str:
        return self.data.spec.name

    def state(self, r: int) -> tuple[int, SiteState]:
        """``(round, state)`` a step of round ``r`` starts from (the initial state: -1)."""
        prev = self.store.latest_before(r)
        if prev is not None:
            return prev
        if self.initial is None:
            raise FedsegError(
                f"site {self.name!r}: a step of round {r + 1} needs the state before round 1, "
                "which was released after the site's first step"
            )
        return -1, self.initial

    def context(self, r: int, data: SiteData | None = None) -> ClientContext:
        """The client context of round ``r`` on ``data`` (default: this site's)."""
        return client_context(
            data or self.data,
            self.method.spec,
            self.train_cfg,
            round_index=r,
            seed=self.seed,
            model=self.model,
            device=self.device,
        )

    def train(self, r: int, payload: Payload) -> tuple[ClientResult, int]:
        """The client step of round ``r``; saves the new private state."""
        check_download(self.name, payload, self.download)
        start, st = self.state(r)
        ctx = self.context(r)
        ctx.optimizer_state = dict(st.get("optimizer", {}))
        seed = derive_seed(self.seed, r, self.data.spec.index)
        with self._precision(), seeded(seed, self.device):
            res = self.method.client_step(payload, st["method"], ctx)
        self.store.save(r, {"method": res.state, "optimizer": ctx.optimizer_state})
        if not self.store.replays:
            self.initial = None
        self.data.release()
        return res, start

    def eval_model(self, r: int, payload: Payload, data: SiteData | None = None) -> nn.Module:
        """The model the method evaluates this site with (on ``data``'s context), from the
        state before round ``r``, seeded like a client step of round ``r``."""
        check_download(self.name, payload, self.download)
        data = data or self.data
        _, st = self.state(r)
        ctx = self.context(r, data)
        with self._precision(), seeded(derive_seed(self.seed, r, data.spec.index), self.device):
            return self.method.eval_model(payload, st["method"], ctx)

    def evaluate(
        self, r: int, payload: Payload, data: SiteData | None = None, split: str = "test"
    ) -> EvalReply:
        """Score ``data`` (default: this site's) on its ``split`` (``test``, or ``val`` for
        the periodic evaluation) with the model the method evaluates this site with, from
        the state before round ``r``."""
        source = data or self.data
        scored = source.scored(split)
        if scored is None or len(scored.test_images) == 0:
            raise FedsegError(f"site {source.spec.name!r} has no {split} cases")
        data = scored
        model = self.eval_model(r, payload, data)
        if self.kept is not None and split == "test":
            self.kept[source.spec.name] = copy.deepcopy(model).cpu().eval()
        with self._precision(), seeded(derive_seed(self.seed, r, data.spec.index), self.device):
            ev = evaluate(
                model,
                data.test_images,
                data.test_masks,
                self.regions,
                batch_size=self.eval_batch_size,
                device=self.device,
                spacing=data.test_spacing,
                ids=data.test_ids,
                segment=self.method.segment,
            )
        source.release()
        return EvalReply(ev.metrics, ev.cases, ev.per_case)
