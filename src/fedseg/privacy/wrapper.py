"""The part every private wrapper shares: a :class:`~fedseg.methods.Method` that hands the
model, partition, templates, steps and evaluation to the method it wraps, and builds the
network from ``privacy.init_from`` with the ``privacy.freeze`` parameters frozen."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods import Method
from fedseg.methods.base import (
    Aggregator,
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
    Template,
)
from fedseg.methods.partition import ResolvedPartition
from fedseg.privacy.settings import PrivacySettings

__all__ = ["PrivateWrapper", "frozen_names", "initial_tensors"]


@functools.cache
def initial_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The global model of the run at ``path`` (a run directory: its
    ``checkpoints/last.pt``; or a checkpoint file): its first payload's tensors."""
    file = path / "checkpoints" / "last.pt" if path.is_dir() else path
    try:
        ck = torch.load(file, map_location="cpu", weights_only=True)
        return dict(ck["server"]["payloads"][0]["tensors"])
    except (OSError, RuntimeError, KeyError, IndexError, TypeError) as e:
        raise ConfigError(
            f"privacy.init_from: {file}: expected a fedseg run directory or checkpoint ({e})"
        ) from None


def frozen_names(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """``model``'s parameter names that match one of ``patterns`` (fnmatch); ConfigError for a
    pattern that matches none."""
    names = [n for n, _ in model.named_parameters()]
    for pat in patterns:
        if not fnmatch.filter(names, pat):
            raise ConfigError(
                f"privacy.freeze: {pat!r} matches no parameter of the network (names look like "
                f"{names[0]!r}, {names[-1]!r})"
            )
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _load_initial(model: nn.Module, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    own = model.state_dict()
    odd = [k for k, t in tensors.items() if k in own and own[k].shape != t.shape]
    shared = [k for k in tensors if k in own]
    if odd:
        k = odd[0]
        raise ConfigError(
            f"privacy.init_from: {path}: {k} has shape {tuple(tensors[k].shape)}, the "
            f"network's {tuple(own[k].shape)}: the checkpoint is of another network"
        )
    if not shared:
        raise ConfigError(f"privacy.init_from: {path}: no tensor name in common with the network")
    model.load_state_dict({k: tensors[k] for k in shared}, strict=False)


class PrivateWrapper(Method):
    """``inner`` unchanged except for the steps a subclass overrides, on the network of
    :meth:`build_model`."""

    def __init__(self, inner: Method, settings: PrivacySettings, name: str, label: str) -> None:
        self.inner, self.settings, self.name = inner, settings, name
        self.config, self.spec, self.model_cfg = inner.config, inner.spec, inner.model_cfg
        self.personalized, self.summary = inner.personalized, f"{inner.summary} ({label})"

    def build_model(self) -> nn.Module:
        """The method's network; with ``init_from`` its tensors from that run's global model,
        and the ``freeze`` parameters (all of them taken from it) set not to train."""
        model = self.inner.build_model()
        path = self.settings.init_from
        if path is None:
            return model
        tensors = initial_tensors(path)
        _load_initial(model, tensors, path)
        frozen = frozen_names(model, self.settings.freeze)
        if missing := [n for n in frozen if n not in tensors]:
            raise ConfigError(
                f"privacy.freeze: {missing[0]} is frozen but not in init_from's model ({path})"
            )
        for name, p in model.named_parameters():
            if name in frozen:
                p.requires_grad_(False)
        return model

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        return self.inner.client_step(payload, state, ctx)

    def init_server(self, model: nn.Module) -> ServerResult:
        return self.inner.init_server(model)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        return self.inner.server_step(uploads, state, ctx)

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        return self.inner.aggregator(state, ctx)

    def parts(self, model: nn.Module) -> ResolvedPartition:
        return self.inner.parts(model)

    def upload_template(self, model: nn.Module) -> Template:
        return self.inner.upload_template(model)

    def download_template(self, model: nn.Module) -> Template:
        return self.inner.download_template(model)

    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        return self.inner.init_client(model, site)

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        return self.inner.eval_model(payload, state, ctx)

    def segment(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return self.inner.segment(model, images)

    def load(self, model: nn.Module, payload: Payload, state: State) -> None:
        self.inner.load(model, payload, state)

    def split(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], State]:
        return self.inner.split(model)
