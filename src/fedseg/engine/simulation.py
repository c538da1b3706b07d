"""A federation of in-memory sites without a run directory: the API tests and notebooks use.

:class:`Simulation` is the engine's round loop (:class:`~fedseg.engine.loop.RoundLoop`) over
an :class:`~fedseg.engine.link.InMemoryLink`; it adds nothing to it but convenient access to
payloads, private states and contexts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fedseg.engine.loop import RoundLoop, RoundPolicy
from fedseg.engine.pool import in_memory_link
from fedseg.engine.server import ServerCore, method_spec
from fedseg.engine.sites import SiteData
from fedseg.engine.worker import SiteWorker
from fedseg.methods import ClientContext, FederationSpec, Method, Payload, State, TrainSettings
from fedseg.methods.base import Template
from fedseg.methods.training import Precision

__all__ = ["Simulation"]


class Simulation:
    """Sites trained one after another on one device, in this process (or, with
    ``workers`` > 1, in that many worker processes with identical results; :meth:`close`
    stops them).

    ``sites`` are the real sites (a pooled method trains one virtual site on their union and
    is evaluated on each of them). ``precision`` is the run's ``engine.amp`` and
    ``engine.channels_last`` (default float32, contiguous; ``auto`` values are resolved per
    network and device as in a run).
    """

    def __init__(
        self,
        method: Method,
        sites: Mapping[str, SiteData],
        train: TrainSettings,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        workers: int = 1,
        threads: int = 0,
        precision: Precision | None = None,
    ) -> None:
        self.method, self._train = method, train
        self.link = in_memory_link(
            method.spec,
            sites,
            {"fg": [1]},
            train=train,
            seed=seed,
            device=device,
            workers=workers,
            threads=threads,
            precision=precision,
        )
        self.link.bind(method)
        self.server = ServerCore(method, train, seed)
        self.loop = RoundLoop(self.server, self.link, RoundPolicy(), "simulation", list(sites))

    @staticmethod
    def method_spec(
        method_cls: type[Method], spec: FederationSpec, sites: Mapping[str, SiteData]
    ) -> FederationSpec:
        """The spec a method sees: the real sites, or the one pooled site for CT."""
        return method_spec(method_cls, spec)

    # -- views ---------------------------------------------------------------------------
    @property
    def train(self) -> TrainSettings:
        return self._train

    @train.setter
    def train(self, value: TrainSettings) -> None:
        """Change the training settings of the rounds still to come (server and sites)."""
        self._train = self.server.train = self.link.train_cfg = value
        for w in self.link.workers.values():
            w.train_cfg = value

    @property
    def model(self) -> nn.Module:
        """The sites' workspace network."""
        return self.link.model

    @property
    def template(self) -> Template:
        return self.server.upload_template

    @property
    def params(self) -> dict[str, int]:
        return self.server.params

    @property
    def payloads(self) -> dict[str, Payload]:
        return self.server.payloads

    @property
    def server_state(self) -> State:
        return self.server.state

    @property
    def sites(self) -> dict[str, SiteData]:
        """The real sites."""
        return self.link.sites

    @property
    def train_sites(self) -> dict[str, SiteData]:
        return {n: w.data for n, w in self.link.workers.items()}

    @property
    def states(self) -> dict[str, State]:
        """Every training site's current private state."""
        return {
            n: w.state(self.train.rounds + 1)[1]["method"] for n, w in self.link.workers.items()
        }

    def context(self, site: SiteData, round_index: int) -> ClientContext:
        """The context a client step of ``site`` in round ``round_index`` gets (the caller
        seeds torch's RNG if it needs the engine's random streams)."""
        return self._worker(site.spec.name).context(round_index, site)

    def eval_model(self, site: str) -> nn.Module:
        """The model ``site`` is evaluated with now (seeded as in the engine's evaluation)."""
        key = site if site in self.link.workers else next(iter(self.link.workers))
        return self.link.workers[key].eval_model(
            self.train.rounds, self.payloads[key], self.sites[site]
        )

    def _worker(self, name: str) -> SiteWorker:
        return self.link.workers.get(name) or next(iter(self.link.workers.values()))

    def close(self) -> None:
        """Stop the worker processes of ``workers`` > 1 (nothing otherwise)."""
        close = getattr(self.link, "close", None)
        if close is not None:
            close()

    # -- work ----------------------------------------------------------------------------
    def round(self, r: int, participants: Sequence[str] | None = None) -> dict[str, Any]:
        """One round: every (or every listed) site's client step, then the server step."""
        return self.loop.round(r, list(participants) if participants else None)

    def evaluate(
        self, regions: Mapping[str, Sequence[int]], batch_size: int = 16
    ) -> dict[str, dict[str, Any]]:
        """Score every real site on its test data with the model it is evaluated with:
        ``{site: {"metrics": {metric: {region: value}}, "cases": n}}``."""
        for w in self.link.workers.values():
            w.regions, w.eval_batch_size = dict(regions), batch_size
        per_site, _ = self.loop.evaluate(self.train.rounds)
        return {s: {"metrics": v.metrics, "cases": v.cases} for s, v in per_site.items()}
