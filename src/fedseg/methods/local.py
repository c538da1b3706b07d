"""Local-only training (LT) and centralized training on pooled data (CT)."""

from __future__ import annotations

from collections.abc import Mapping

from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.partition import Partition
from fedseg.methods.registry import register_method
from fedseg.methods.training import train_steps

__all__ = ["Centralized", "LocalOnly"]


@register_method("local")
class LocalOnly(Method):
    """LT: each site trains its own model on its own data; nothing is exchanged."""

    partition = Partition(shared=(), private=("*",))
    personalized = True
    summary = "LT: local training only, every weight private, nothing sent"

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        self.load(ctx.model, payload, state)
        metrics = train_steps(ctx.model, ctx, iters=self.iterations(ctx))
        _, private = self.split(ctx.model)
        return ClientResult(Payload(num_examples=ctx.site.num_train), private, metrics)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        return ServerResult({s.name: Payload() for s in ctx.spec.sites}, state)

    def iterations(self, ctx: ClientContext) -> int:
        """Optimiser steps of one round: ``local_iters``, or ``local_epochs`` passes."""
        return ctx.steps()


class CentralizedConfig(MethodConfig):
    match_federation_steps: bool = True
    """Train ``local_iters`` x (number of pooled sites) steps per round: as many optimiser
    steps as the whole federation makes with the same config (False: ``local_iters``). With
    ``local_epochs`` the pooled site makes that many passes over the union of the sites'
    data, which is already the federation's step count."""


@register_method("centralized")
class Centralized(LocalOnly):
    """CT: one model trained on the union of all sites' training data (an upper bound)."""

    Config = CentralizedConfig
    personalized = False
    pooled = True
    summary = "CT: centralized training on pooled data, evaluated on every site's test split"

    def iterations(self, ctx: ClientContext) -> int:
        if ctx.train.local_epochs is not None:
            return ctx.steps()
        scale = max(ctx.spec.pooled_sites, 1) if self.config.match_federation_steps else 1
        return ctx.train.local_iters * scale
