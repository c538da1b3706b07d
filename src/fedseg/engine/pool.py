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
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from fedseg.engine.link import Failure, InMemoryLink, Replies
from fedseg.engine.site_state import SiteStateStore
from fedseg.engine.sites import POOLED, SiteData
from fedseg.engine.worker import (
    RELEASED,
    EvalReply,
    MemoryStore,
    SiteWorker,
    TrainReply,
    initial_model,
)
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


PAYLOAD_CACHE_BYTES = 1 << 30
"""Pickled size of the payloads a worker process keeps for reuse; beyond it the least
recently used are dropped (per-site payloads of a large federation would otherwise pile up
in every process) and sent again when needed."""

HELD = "held"
"""Sent instead of a site's private state that the worker process already holds."""


def _payload(packed: tuple[int, bytes | None, frozenset[int]]) -> Payload:
    """The payload of ``packed`` = (token, pickled payload or None, tokens this process
    keeps), unpickled once per process and kept while the server keeps sending it (the
    payload evaluated after round r is the one trained in round r + 1) and the server's
    record of this process keeps it (:data:`PAYLOAD_CACHE_BYTES`): sites sharing one payload
    object in the server share one here too (validated once)."""
    token, blob, alive = packed
    cache: dict[int, Payload] = _CHILD.setdefault("payloads", {})
    for gone in set(cache) - alive:
        del cache[gone]
    if token not in cache:
        if blob is None:
            raise RuntimeError(f"worker process does not hold payload {token}")
        cache[token] = pickle.loads(blob)
    return cache[token]


def _state(w: SiteWorker, saved: Any) -> None:
    """Set the site's private state, unless the parent says this process holds it; where
    the sites keep theirs on disk (``engine.site_states: disk``) the parent sends the site's
    store, whose files this process reads and writes."""
    if isinstance(saved, SiteStateStore):
        w.store = saved
    elif not (isinstance(saved, str) and saved == HELD):
        w.store.saved = saved  # type: ignore[attr-defined]


def _train(blob: bytes) -> bytes:
    name, data, initial, saved, train, r, packed = pickle.loads(blob)
    payload = _payload(packed)
    w = _worker(name, data, initial)
    w.train_cfg = train
    _state(w, saved)
    res, start = w.train(r, payload)
    new = None if isinstance(w.store, SiteStateStore) else w.store.saved  # type: ignore[attr-defined]
    return pickle.dumps((TrainReply(res.upload, res.metrics, start), new))


def _evaluate(blob: bytes) -> bytes:
    name, data, initial, saved, target, target_data, regions, batch, r, packed = pickle.loads(blob)
    payload = _payload(packed)
    w = _worker(name, data, initial)
    w.regions, w.eval_batch_size = dict(regions), batch
    _state(w, saved)
    cached: dict[str, SiteData] = _CHILD.setdefault("eval_data", {})
    if target_data is not None:
        cached[target] = target_data
    return pickle.dumps(w.evaluate(r, payload, cached[target] if target != name else None))


@dataclass
class _Slot:
    """One worker process and what it already holds: site data, the version of each site's
    private state (:class:`_CountedStore`) and the payloads (by token)."""

    pool: ProcessPoolExecutor
    has: set[str] = field(default_factory=set)
    states: dict[str, int] = field(default_factory=dict)
    payloads: OrderedDict[int, int] = field(default_factory=OrderedDict)
    """Tokens of the payloads the process keeps, least recently used first, with their
    pickled sizes."""


@dataclass
class _Job:
    key: str
    fn: Callable[[bytes], bytes]
    args: Callable[[_Slot], tuple[Any, ...]]
    """The job's arguments for the process of the slot (what it holds is not sent again)."""
    sends: set[str]
    """What the process holds after the job (site data for training or evaluation)."""


class _CountedStore(MemoryStore):
    """The parent's copy of a site's newest state, with a ``version`` that every change
    bumps, so that the link knows which worker process holds the current state."""

    def __init__(self) -> None:
        self.version = 0
        super().__init__()

    @property  # type: ignore[override]
    def saved(self) -> tuple[int, Any] | None:
        return self._saved

    @saved.setter
    def saved(self, value: tuple[int, Any] | None) -> None:
        self._saved = value
        self.version += 1


class _Packer:
    """What a request sends a process for a site's payload: ``(token, the payload pickled or
    None if the process holds it, the tokens the process keeps afterwards)``. A payload is
    pickled once per request and dropped after its last job; a process keeps the payloads of
    this request up to :data:`PAYLOAD_CACHE_BYTES`, least recently used dropped first."""

    def __init__(
        self,
        tokens: Mapping[str, int],
        payloads: Mapping[str, Payload],
        uses: Mapping[str, int] | None = None,
    ) -> None:
        self.tokens, self.payloads = dict(tokens), payloads
        self.alive = frozenset(self.tokens.values())
        self.left: Counter[int] = Counter()
        for site, token in self.tokens.items():
            self.left[token] += 1 if uses is None else uses[site]
        self.blobs: dict[int, bytes] = {}
        """Pickled payloads that jobs still to come may need."""

    def __call__(self, site: str, slot: _Slot) -> tuple[int, bytes | None, frozenset[int]]:
        token, held = self.tokens[site], slot.payloads
        for gone in [t for t in held if t not in self.alive]:
            del held[gone]
        self.left[token] -= 1
        blob: bytes | None = None
        if token in held:
            held.move_to_end(token)
        else:
            blob = self.blobs.get(token) or pickle.dumps(self.payloads[site])
            held[token] = len(blob)
            while len(held) > 1 and sum(held.values()) > PAYLOAD_CACHE_BYTES:
                held.popitem(last=False)
        if self.left[token] <= 0:
            self.blobs.pop(token, None)
        elif blob is not None:
            self.blobs[token] = blob
        return token, blob, frozenset(held)


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
        self._tokens: dict[int, tuple[int, weakref.ref[Payload]]] = {}
        self._next_token = 0

    def bind(self, method: Method, run_uid: str = "") -> None:
        self.close()
        super().bind(method, run_uid)
        if self.state_root is None:
            for w in self.workers.values():
                w.store = _CountedStore()
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

    def _site_args(self, name: str, slot: _Slot) -> tuple[Any, Any, Any, Any]:
        """The site's name, its data and initial state (if the process lacks them) and its
        private state (:data:`HELD` if the process holds the current one)."""
        w = self.workers[name]
        fresh = name not in slot.has
        store = w.store
        if isinstance(store, SiteStateStore):
            saved: Any = store  # no state in memory: the process uses the site's files
        else:
            counted: _CountedStore = store  # type: ignore[assignment]
            held = slot.states.get(name) == counted.version
            slot.states[name] = counted.version
            saved = HELD if held else counted.saved
        return (
            name,
            w.data if fresh else None,
            (RELEASED if w.initial is None else w.initial) if fresh else None,
            saved,
        )

    def _token(self, p: Payload) -> int:
        """A token per payload object, kept while the object lives."""
        known = self._tokens.get(id(p))
        if known is None or known[1]() is not p:
            self._tokens = {k: v for k, v in self._tokens.items() if v[1]() is not None}
            self._next_token += 1
            known = self._tokens[id(p)] = (self._next_token, weakref.ref(p))
        return known[0]

    def _pack(
        self, payloads: Mapping[str, Payload], uses: Mapping[str, int] | None = None
    ) -> _Packer:
        """The packer of one request (``uses``: jobs per site, default 1)."""
        return _Packer({site: self._token(p) for site, p in payloads.items()}, payloads, uses)

    def train(self, r: int, payloads: Mapping[str, Payload]) -> Replies:
        if self.num_workers == 1 or len(payloads) < 2:
            return super().train(r, payloads)
        packed = self._pack(payloads)
        jobs = [
            _Job(
                name,
                _train,
                lambda slot, name=name: (
                    *self._site_args(name, slot),
                    self.train_cfg,
                    r,
                    packed(name, slot),
                ),
                {name},
            )
            for name in payloads
        ]
        return self._replies(jobs)

    def _replies(self, jobs: list[_Job]) -> Iterator[tuple[str, TrainReply | Failure]]:
        """Training replies in the order of ``jobs``, each handed over as soon as it and
        those before it are back, so the server aggregates (and drops) uploads while later
        sites still train."""
        for name, (reply, saved), slot in self._results_in_order(jobs):
            if self.state_root is None:  # else the process wrote the site's file
                store: _CountedStore = self.workers[name].store  # type: ignore[assignment]
                store.saved = saved
                self.workers[name].initial = None  # the store never goes back to it
                slot.states[name] = store.version  # the process holds the state it returned
            yield name, reply

    def evaluate(
        self, r: int, payloads: Mapping[str, Payload], split: str = "test"
    ) -> dict[str, EvalReply | Failure]:
        pairs = [
            (name, real) for name in payloads for real in (self.sites if name == POOLED else [name])
        ]
        if self.num_workers == 1 or len(pairs) < 2 or split != "test":  # val: small, in here
            return super().evaluate(r, payloads, split)
        packed = self._pack(payloads, Counter(name for name, _ in pairs))
        jobs = [
            _Job(
                real,
                _evaluate,
                lambda slot, name=name, real=real: (
                    *self._site_args(name, slot),
                    real,
                    self.sites[real] if real != name and f"eval:{real}" not in slot.has else None,
                    self.regions,
                    self.eval_batch_size,
                    r,
                    packed(name, slot),
                ),
                {name, f"eval:{real}"},
            )
            for name, real in pairs
        ]
        return {key: result for key, (result, _) in self._run(jobs).items()}

    def _run(self, jobs: list[_Job]) -> dict[str, tuple[Any, _Slot]]:
        """Run ``jobs`` on the worker processes, each on the next free one; (result, slot
        that ran it) by key in the order of ``jobs``."""
        return {key: (result, slot) for key, result, slot in self._results_in_order(jobs)}

    def _results_in_order(self, jobs: list[_Job]) -> Iterator[tuple[str, Any, _Slot]]:
        """Run ``jobs`` on the worker processes, each on the next free one; yield (key,
        result, slot that ran it) in the order of ``jobs`` as soon as each is back (results
        that come back early wait). Left early, it waits for the running jobs and forgets
        which private states their processes hold."""
        slots = self._start_slots()
        pending, running = deque(jobs), {}
        free = list(slots)
        done_early: dict[str, tuple[Any, _Slot]] = {}
        order = deque(job.key for job in jobs)
        try:
            while order:
                while pending and free:
                    job, slot = pending.popleft(), free.pop(0)
                    blob = pickle.dumps(job.args(slot))
                    slot.has.update(job.sends)
                    running[slot.pool.submit(job.fn, blob)] = (job, slot)
                while order and order[0] in done_early:
                    key = order.popleft()
                    yield key, *done_early.pop(key)
                if not order:
                    break
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    job, slot = running.pop(fut)
                    free.append(slot)
                    done_early[job.key] = (pickle.loads(fut.result()), slot)
        finally:
            if running:
                wait(list(running))
                for job, slot in running.values():
                    for site in job.sends:
                        slot.states.pop(site, None)
            for key, (_, slot) in done_early.items():
                slot.states.pop(key, None)


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
