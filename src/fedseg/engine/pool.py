"""Sites of a round trained (and evaluated) in parallel worker processes: ``engine.workers``.

:class:`ParallelLink` is an :class:`~fedseg.engine.link.InMemoryLink` whose client steps and
evaluations run in ``workers`` processes. Every step starts from the payload and the private
state the parent sends and is seeded from (seed, round, site), so which process runs it and in
which order does not change any result: a run is bit-identical to the sequential engine (at
the same number of torch threads per step). The parent keeps every site's state (checkpoints
and resume are unchanged); a worker process caches the data of the sites it has trained.

Workers are started with ``forkserver`` (CUDA-safe; ``spawn`` where it is unavailable), once per
link, and torch's CPU threads are split between them.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from fedseg.engine.link import Failure, InMemoryLink, Replies
from fedseg.engine.sites import POOLED, SiteData
from fedseg.engine.worker import EvalReply, MemoryStore, SiteWorker, TrainReply, initial_model
from fedseg.errors import ConfigError
from fedseg.methods import FederationSpec, Method, Payload, TrainSettings

__all__ = ["ParallelLink", "in_memory_link"]

_CHILD: dict[str, Any] = {}
"""A worker process's method, workspace model and site workers (set by :func:`_start`)."""


def _start(blob: bytes) -> None:
    method, seed, device, threads, prec = pickle.loads(blob)
    torch.set_num_threads(threads)
    model = initial_model(method, seed, device)
    _CHILD.update(
        method=method,
        seed=seed,
        device=device,
        model=model,
        download=method.download_template(model),
        precision=prec,
        workers={},
    )


def _worker(name: str, data: SiteData | None, initial: Any) -> SiteWorker:
    """The process's worker of site ``name`` (created from ``data`` on first use)."""
    workers: dict[str, SiteWorker] = _CHILD["workers"]
    if name not in workers:
        if data is None:
            raise RuntimeError(f"worker process has no data of site {name!r}")
        workers[name] = SiteWorker(
            _CHILD["method"],
            data,
            train=TrainSettings(),
            seed=_CHILD["seed"],
            device=_CHILD["device"],
            model=_CHILD["model"],
            store=MemoryStore(),
            regions={},
            eval_batch_size=1,
            download=_CHILD["download"],
            initial=initial,
            precision=_CHILD["precision"],
        )
    return workers[name]


def _payload(packed: tuple[tuple[int, int], bytes]) -> Payload:
    """The payload of ``packed`` = (token, pickled payload), unpickled once per process: sites
    sharing one payload object in the server share one here too (validated once)."""
    token, blob = packed
    cache: dict[tuple[int, int], Payload] = _CHILD.setdefault("payloads", {})
    if token not in cache:
        if any(t[0] != token[0] for t in cache):  # a new request of the server: drop the old
            cache.clear()
        cache[token] = pickle.loads(blob)
    return cache[token]


def _train(blob: bytes) -> bytes:
    name, data, initial, saved, train, r, packed = pickle.loads(blob)
    payload = _payload(packed)
    w = _worker(name, data, initial)
    w.train_cfg, w.store.saved = train, saved  # type: ignore[attr-defined]
    res, start = w.train(r, payload)
    return pickle.dumps((TrainReply(res.upload, res.metrics, start), w.store.saved))  # type: ignore[attr-defined]


def _evaluate(blob: bytes) -> bytes:
    name, data, initial, saved, target, target_data, regions, batch, r, packed = pickle.loads(blob)
    payload = _payload(packed)
    w = _worker(name, data, initial)
    w.regions, w.eval_batch_size, w.store.saved = dict(regions), batch, saved  # type: ignore[attr-defined]
    cached: dict[str, SiteData] = _CHILD.setdefault("eval_data", {})
    if target_data is not None:
        cached[target] = target_data
    return pickle.dumps(w.evaluate(r, payload, cached[target] if target != name else None))


@dataclass
class _Slot:
    """One worker process and the sites whose data it already holds."""

    pool: ProcessPoolExecutor
    has: set[str] = field(default_factory=set)


@dataclass
class _Job:
    key: str
    fn: Callable[[bytes], bytes]
    args: Callable[[set[str]], tuple[Any, ...]]
    """The job's arguments for a process holding the data of the sites given."""
    sends: set[str]
    """What the process holds after the job (site data for training or evaluation)."""


class ParallelLink(InMemoryLink):
    """In-memory sites whose steps run in ``workers`` processes with ``threads`` torch
    threads each (0: this process's threads divided among the workers)."""

    def __init__(
        self,
        spec: FederationSpec,
        sites: Mapping[str, SiteData],
        regions: Mapping[str, list[int]],
        *,
        workers: int = 2,
        threads: int = 0,
        **settings: Any,
    ) -> None:
        """``settings`` are :class:`InMemoryLink`'s (train, seed, device, ...)."""
        if workers < 1:
            raise ConfigError(f"engine.workers must be at least 1, got {workers}")
        super().__init__(spec, sites, regions, **settings)
        self.num_workers = workers
        self.threads = threads or max(1, torch.get_num_threads() // workers)
        self._slots: list[_Slot] = []
        self._method: Method | None = None
        self._requests = 0

    def bind(self, method: Method, run_uid: str = "") -> None:
        self.close()
        super().bind(method, run_uid)
        self._method = method

    def _start_slots(self) -> list[_Slot]:
        if not self._slots:
            methods = mp.get_all_start_methods()
            ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
            if ctx.get_start_method() == "forkserver":
                ctx.set_forkserver_preload([__name__])
            blob = pickle.dumps(
                (self._method, self.seed, self.device, self.threads, self.precision)
            )
            self._slots = [
                _Slot(ProcessPoolExecutor(1, mp_context=ctx, initializer=_start, initargs=(blob,)))
                for _ in range(self.num_workers)
            ]
            weakref.finalize(self, _shutdown, list(self._slots))
        return self._slots

    def close(self) -> None:
        """Stop the worker processes (started again on the next step)."""
        _shutdown(self._slots)
        self._slots = []

    def __enter__(self) -> ParallelLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _site_args(self, name: str, has: set[str]) -> tuple[Any, Any, Any]:
        w = self.workers[name]
        fresh = name not in has
        return (name, w.data if fresh else None, w.initial if fresh else None)

    def _pack(self, payloads: Mapping[str, Payload]) -> dict[str, tuple[tuple[int, int], bytes]]:
        """Each distinct payload object pickled once, with a token unique to this request."""
        self._requests += 1
        blobs: dict[int, bytes] = {}
        out = {}
        for site, p in payloads.items():
            if id(p) not in blobs:
                blobs[id(p)] = pickle.dumps(p)
            out[site] = ((self._requests, id(p)), blobs[id(p)])
        return out

    def train(self, r: int, payloads: Mapping[str, Payload]) -> Replies:
        if self.num_workers == 1 or len(payloads) < 2:
            return super().train(r, payloads)
        packed = self._pack(payloads)
        jobs = [
            _Job(
                name,
                _train,
                lambda has, name=name: (
                    *self._site_args(name, has),
                    self.workers[name].store.saved,  # type: ignore[attr-defined]
                    self.train_cfg,
                    r,
                    packed[name],
                ),
                {name},
            )
            for name in payloads
        ]
        out: dict[str, TrainReply | Failure] = {}
        for name, (reply, saved) in self._run(jobs).items():
            self.workers[name].store.saved = saved  # type: ignore[attr-defined]
            out[name] = reply
        return out

    def evaluate(
        self, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, EvalReply | Failure]:
        pairs = [
            (name, real) for name in payloads for real in (self.sites if name == POOLED else [name])
        ]
        if self.num_workers == 1 or len(pairs) < 2 or split != "test":  # val: small, in here
            return super().evaluate(r, payloads, split)
        packed = self._pack(payloads)
        jobs = [
            _Job(
                real,
                _evaluate,
                lambda has, name=name, real=real: (
                    *self._site_args(name, has),
                    self.workers[name].store.saved,  # type: ignore[attr-defined]
                    real,
                    self.sites[real] if real != name and f"eval:{real}" not in has else None,
                    self.regions,
                    self.eval_batch_size,
                    r,
                    packed[name],
                ),
                {name, f"eval:{real}"},
            )
            for name, real in pairs
        ]
        return dict(self._run(jobs))

    def _run(self, jobs: list[_Job]) -> dict[str, Any]:
        """Run ``jobs`` on the worker processes, each on the next free one; results by key
        in the order of ``jobs``."""
        slots = self._start_slots()
        pending, running = deque(jobs), {}
        free = list(slots)
        results: dict[str, Any] = {}
        while pending or running:
            while pending and free:
                job, slot = pending.popleft(), free.pop(0)
                blob = pickle.dumps(job.args(slot.has))
                slot.has.update(job.sends)
                running[slot.pool.submit(job.fn, blob)] = (job, slot)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                job, slot = running.pop(fut)
                free.append(slot)
                results[job.key] = pickle.loads(fut.result())
        return {job.key: results[job.key] for job in jobs}


def _shutdown(slots: list[_Slot]) -> None:
    for s in slots:
        s.pool.shutdown(wait=True, cancel_futures=True)


def in_memory_link(
    spec: FederationSpec,
    sites: Mapping[str, SiteData],
    regions: Mapping[str, list[int]],
    *,
    workers: int = 1,
    threads: int = 0,
    **settings: Any,
) -> InMemoryLink:
    """The in-process link: sequential sites (``workers`` 1) or :class:`ParallelLink`;
    ``settings`` are :class:`InMemoryLink`'s (train, seed, device, ...)."""
    if workers <= 1:
        return InMemoryLink(spec, sites, regions, **settings)
    return ParallelLink(spec, sites, regions, workers=workers, threads=threads, **settings)
