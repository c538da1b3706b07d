"""The round loop over in-memory sites, shared by the in-process runner and tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import torch

from fedseg.engine.sites import POOLED, SiteData, client_context, derive_seed, pooled_site
from fedseg.evaluation import evaluate
from fedseg.methods import (
    ClientContext,
    FederationSpec,
    Method,
    Payload,
    ServerContext,
    ServerResult,
    State,
    TrainSettings,
)
from fedseg.methods.base import validate_upload

__all__ = ["Simulation", "evaluate_site", "server_round"]


def server_round(
    method: Method,
    uploads: Mapping[str, Payload],
    state: State,
    r: int,
    train: TrainSettings,
    seed: int,
) -> ServerResult:
    """The server step of round ``r`` with its generator seeded from (seed, round): the same
    in every engine."""
    gen = torch.Generator().manual_seed(derive_seed(seed, r, -1))
    return method.server_step(uploads, state, ServerContext(method.spec, r, train, gen))


def evaluate_site(
    method: Method,
    payload: Payload,
    state: State,
    site: SiteData,
    ctx: ClientContext,
    regions: Mapping[str, Sequence[int]],
    batch_size: int,
) -> dict[str, Any]:
    """Score ``site`` on its test data with the model the method evaluates it with:
    ``{"metrics": {metric: {region: value}}, "cases": n}``."""
    model = method.eval_model(payload, state, ctx)
    ev = evaluate(
        model,
        site.test_images,
        site.test_masks,
        regions,
        batch_size=batch_size,
        device=ctx.device,
        spacing=site.test_spacing,
        ids=site.test_ids,
    )
    return {"metrics": ev.metrics, "cases": ev.cases}


class Simulation:
    """A federation of in-memory sites trained sequentially on one device.

    The model is one workspace shared by all sites; a site's private state holds only what
    its method keeps private, so memory does not grow by a full model per site.
    """

    def __init__(
        self,
        method: Method,
        sites: Mapping[str, SiteData],
        train: TrainSettings,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.method, self.sites, self.train = method, dict(sites), train
        self.seed, self.device = seed, torch.device(device)
        self.train_sites = {POOLED: pooled_site(self.sites)} if method.pooled else self.sites
        torch.manual_seed(seed)
        self.model = method.build_model().to(self.device)
        self.template = method.upload_template(self.model)
        init = method.init_server(self.model)
        self.payloads, self.server_state = init.payloads, init.state
        self.states = {
            n: method.init_client(self.model, s.spec) for n, s in self.train_sites.items()
        }

    @staticmethod
    def method_spec(
        method_cls: type[Method], spec: FederationSpec, sites: Mapping[str, SiteData]
    ) -> FederationSpec:
        """The spec a method sees: the real sites, or the one pooled site for CT."""
        if not method_cls.pooled:
            return spec
        pooled = pooled_site(dict(sites)).spec
        return FederationSpec(**{**asdict(spec), "sites": (pooled,), "pooled_sites": len(sites)})

    @property
    def params(self) -> dict[str, int]:
        return self.method.parts(self.model).params()

    def context(self, site: SiteData, round_index: int) -> ClientContext:
        return client_context(
            site,
            self.method.spec,
            self.train,
            round_index=round_index,
            seed=self.seed,
            model=self.model,
            device=self.device,
        )

    def round(self, r: int, participants: Sequence[str] | None = None) -> dict[str, Any]:
        """One round: every (or every listed) site's client step, then the server step."""
        uploads, metrics = {}, {}
        for name in participants or list(self.train_sites):
            site = self.train_sites[name]
            res = self.method.client_step(
                self.payloads[name], self.states[name], self.context(site, r)
            )
            validate_upload(name, res.upload, self.template)
            uploads[name], self.states[name], metrics[name] = res.upload, res.state, res.metrics
        out = server_round(self.method, uploads, self.server_state, r, self.train, self.seed)
        self.payloads, self.server_state = out.payloads, out.state
        return {
            "round": r,
            "participants": list(uploads),
            "clients": metrics,
            "server": out.metrics,
        }

    def evaluate(
        self, regions: Mapping[str, Sequence[int]], batch_size: int = 16
    ) -> dict[str, dict[str, Any]]:
        """Score every real site on its test data with the model it is evaluated with."""
        out = {}
        for name, site in self.sites.items():
            key = POOLED if self.method.pooled else name
            ctx = self.context(site, self.train.rounds)
            out[name] = evaluate_site(
                self.method, self.payloads[key], self.states[key], site, ctx, regions, batch_size
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the last finished round."""
        return {
            "payloads": {s: asdict(p) for s, p in self.payloads.items()},
            "server_state": self.server_state,
            "client_states": self.states,
        }

    def load_state_dict(self, ck: Mapping[str, Any]) -> None:
        self.payloads = {s: Payload(**p) for s, p in ck["payloads"].items()}
        self.server_state, self.states = ck["server_state"], ck["client_states"]
