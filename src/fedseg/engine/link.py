"""How the round loop reaches the sites: the :class:`Link` protocol and in-memory sites.

The loop (:mod:`fedseg.engine.loop`) is written once against :class:`Link`. Two links exist:
:class:`InMemoryLink` (sites as :class:`~fedseg.engine.worker.SiteWorker` objects in this
process: the default simulator) and the Flower link (``fedseg.engine.flower.link``), whose
sites are SuperNodes. A link returns, per site, a reply or the reason why there is none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from fedseg.engine.site_state import SiteStateStore
from fedseg.engine.sites import POOLED, SiteData, pooled_site
from fedseg.engine.worker import EvalReply, MemoryStore, SiteWorker, TrainReply, initial_model
from fedseg.errors import DataError
from fedseg.methods import FederationSpec, Method, Payload, TrainSettings
from fedseg.methods.training import Precision

__all__ = ["EvalReply", "Failure", "InMemoryLink", "Link", "Replies", "TrainReply"]

Failure = str
"""Why a site has no reply (timeout, error, disconnect, rejected upload)."""

Replies = Mapping[str, "TrainReply | Failure"] | Iterable[tuple[str, "TrainReply | Failure"]]
"""A round's training replies: a mapping by site, or (site, reply) pairs in the order of the
payloads, produced lazily by links that train sites one after another (so the server
aggregates each upload before the next site trains)."""


class Link(Protocol):
    """The sites of one run, as the round loop sees them."""

    engine: str
    """``inprocess`` or ``flower`` (recorded in results.json)."""

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        """Connected sites and their self-descriptions (no data)."""
        ...

    def federation(
        self, order: list[str], infos: Mapping[str, Mapping[str, Any]]
    ) -> FederationSpec:
        """The federation of the sites in ``order``, described by ``infos``."""
        ...

    def bind(self, method: Method, run_uid: str) -> None:
        """Prepare the sites to run ``method`` in run ``run_uid``."""
        ...

    def train(self, r: int, payloads: Mapping[str, Payload]) -> Replies:
        """The client step of round ``r`` on each site of ``payloads``."""
        ...

    def evaluate(
        self, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, EvalReply | Failure]:
        """Evaluations on ``split`` keyed by the real sites the training sites of ``payloads``
        stand for (the pooled site of centralized training stands for every site)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Site states the server checkpoints (empty when sites keep their own)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class InMemoryLink:
    """Sites held in this process, trained one after another on one device.

    All sites share one workspace model; a site's private state holds only what its method
    keeps private, so memory grows with private state only. With ``state_root`` the private
    states live on disk instead (``state_root/<site>/<run uid>/``, the state before round 1
    and the newest ``keep`` rounds, :class:`~fedseg.engine.site_state.SiteStateStore`), read
    when the site trains or is evaluated: memory then holds none of them and the checkpoint
    records only which round each site's file holds. With ``keep_eval_models`` each site's
    last test-evaluation model is kept (:attr:`eval_models`), for export.
    """

    engine = "inprocess"

    def __init__(
        self,
        spec: FederationSpec,
        sites: Mapping[str, SiteData],
        regions: Mapping[str, list[int]],
        *,
        train: TrainSettings,
        seed: int,
        device: torch.device | str = "cpu",
        eval_batch_size: int = 16,
        precision: Precision | None = None,
        state_root: Path | None = None,
        keep: int = 2,
        keep_eval_models: bool = False,
    ) -> None:
        self.spec, self.sites, self.regions = spec, dict(sites), dict(regions)
        self.state_root, self.keep = state_root, keep
        self.keep_eval_models = keep_eval_models
        self.train_cfg, self.seed, self.device = train, seed, torch.device(device)
        self.eval_batch_size = eval_batch_size
        self.precision = precision or Precision()
        self.workers: dict[str, SiteWorker] = {}

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        """Every site (once bound: every training site, e.g. the pooled one) is connected."""
        return {name: {"site": name} for name in self.workers or self.sites}

    def federation(
        self, order: list[str], infos: Mapping[str, Mapping[str, Any]]
    ) -> FederationSpec:
        return self.spec

    def bind(self, method: Method, run_uid: str = "") -> None:
        model = initial_model(method, self.seed, self.device)
        download = method.download_template(model)
        train_sites = {POOLED: pooled_site(self.sites)} if method.pooled else self.sites
        disk = self.state_root is not None
        self.workers = {}
        for name, data in train_sites.items():
            worker = self.workers[name] = SiteWorker(
                method,
                data,
                train=self.train_cfg,
                seed=self.seed,
                device=self.device,
                model=model,
                store=self._disk_store(name, run_uid) if disk else MemoryStore(),
                regions=self.regions,
                precision=self.precision,
                eval_batch_size=self.eval_batch_size,
                download=download,
            )
            worker.kept = {} if self.keep_eval_models else None
            if disk:  # the state before round 1 on disk too: memory holds no state
                store: SiteStateStore = worker.store  # type: ignore[assignment]
                if worker.initial is not None and -1 not in store.rounds():
                    store.save(-1, worker.initial)
                worker.initial = None

    def _disk_store(self, name: str, run_uid: str) -> SiteStateStore:
        assert self.state_root is not None
        return SiteStateStore(self.state_root / name / (run_uid or "run"), self.keep, cache=False)

    @property
    def model(self) -> torch.nn.Module:
        return next(iter(self.workers.values())).model

    @property
    def eval_models(self) -> dict[str, torch.nn.Module]:
        """With ``keep_eval_models``: the models each real site was last scored with on its
        test split, CPU copies (empty when the sites ran in other processes)."""
        return {site: m for w in self.workers.values() for site, m in (w.kept or {}).items()}

    def train(self, r: int, payloads: Mapping[str, Payload]) -> Iterator[tuple[str, TrainReply]]:
        """Sites train one after another; each reply is handed over before the next site
        trains, so only one upload is alive at a time."""
        for name, payload in payloads.items():
            res, start = self.workers[name].train(r, payload)
            yield name, TrainReply(res.upload, res.metrics, start)

    def evaluate(
        self, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, EvalReply | Failure]:
        out: dict[str, EvalReply | Failure] = {}
        for name, payload in payloads.items():
            worker = self.workers[name]
            targets = self.sites if name == POOLED else {name: self.sites[name]}
            for real, data in targets.items():
                if data.scored(split) is None:
                    out[real] = f"no {split} split"
                    continue
                out[real] = worker.evaluate(r, payload, data, split)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Each site's newest private state (with states on disk: ``{"on_disk": round}``,
        the round whose file holds it)."""
        if self.state_root is not None:
            return {
                name: {"on_disk": w.store.rounds()[-1]}  # type: ignore[attr-defined]
                for name, w in self.workers.items()
            }
        return {
            name: w.store.saved  # type: ignore[attr-defined]
            for name, w in self.workers.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, saved in state.items():
            store = self.workers[name].store
            if isinstance(saved, Mapping) and "on_disk" in saved:
                if not isinstance(store, SiteStateStore):
                    raise DataError(f"checkpoint: site {name!r} keeps its state on disk")
                if saved["on_disk"] not in store.rounds():
                    raise DataError(
                        f"{store.path(saved['on_disk'])}: site {name!r}'s private state, "
                        f"which the checkpoint names, is missing; found {store.rounds()}"
                    )
            else:
                store.saved = None if saved is None else tuple(saved)  # type: ignore[attr-defined]
