"""Sites of a round in worker processes (``engine.workers``): results identical to the
sequential engine."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from fedseg.config import RunConfig
from fedseg.engine.pool import ParallelLink
from fedseg.engine.simulation import Simulation
from fedseg.methods import Payload, TrainSettings, get_method
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4)
REGIONS = {"fg": [1]}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sim(name: str, workers: int) -> Simulation:
    spec, sites = toy_federation(3, size=32, with_val=True)
    cls = get_method(name)
    method = cls(cls.Config(), Simulation.method_spec(cls, spec, sites))
    return Simulation(method, sites, TRAIN, seed=3, workers=workers, threads=1)


def _run(name: str, workers: int) -> tuple[Simulation, list[dict], dict]:
    sim = _sim(name, workers)
    try:
        records = [sim.round(r) for r in range(TRAIN.rounds)]
        return sim, records, sim.evaluate(REGIONS)
    finally:
        sim.close()


def _assert_equal(a, b, where: str = "") -> None:
    """Exact equality of nested tensors, numbers and containers."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", ["fedavg", "fedlppa", "centralized"])
def test_two_workers_bit_identical_to_sequential(name: str) -> None:
    seq, seq_rec, seq_ev = _run(name, 1)
    par, par_rec, par_ev = _run(name, 2)
    assert isinstance(par.link, ParallelLink) and not isinstance(seq.link, ParallelLink)
    for a, b in zip(seq_rec, par_rec, strict=True):
        _assert_equal(a["clients"], b["clients"], "client metrics")
        assert a["comm"] == b["comm"] and a["participants"] == b["participants"]
    for site, payload in seq.payloads.items():
        _assert_equal(payload.tensors, par.payloads[site].tensors, f"payload {site}")
    _assert_equal(seq.states, par.states, "private states")
    _assert_equal(seq.server_state, par.server_state, "server state")
    _assert_equal(seq_ev, par_ev, "evaluation")
    assert set(seq_ev) == {"site0", "site1", "site2"}
    assert any(float(m["loss"]) > 0 for m in seq_rec[-1]["clients"].values())


def test_parallel_steps_start_from_the_saved_private_state() -> None:
    """A second round continues each site's own state: the state after round 1 differs from
    the initial one for a method with private weights; the server process releases the
    initial states once the sites hold newer ones."""
    sim = _sim("fedbn", 2)
    initial = {name: w.initial for name, w in sim.link.workers.items()}
    try:
        for r in range(TRAIN.rounds):
            sim.round(r)
    finally:
        sim.close()
    for name, worker in sim.link.workers.items():
        saved, first_state = worker.store.saved, initial[name]
        assert saved is not None and saved[0] == TRAIN.rounds - 1, name
        assert worker.initial is None and first_state is not None, name
        first = next(iter(saved[1]["method"]["weights"]))
        assert not torch.equal(
            saved[1]["method"]["weights"][first], first_state["method"]["weights"][first]
        )


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="workers"):
        RunConfig.model_validate({"data": {"root": "x"}, "engine": {"workers": 0}})


def test_worker_processes_are_not_sent_what_they_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that holds a site's current private state gets HELD instead of it, and a
    payload it already holds (the model evaluated after round r is trained in round r + 1)
    goes by token only; results stay identical to the sequential engine (test above)."""
    from fedseg.engine import pool

    states, blobs = [], []
    site_args, pack = pool.ParallelLink._site_args, pool.ParallelLink._pack

    def recorded_site_args(self, name, slot):  # type: ignore[no-untyped-def]
        out = site_args(self, name, slot)
        states.append(isinstance(out[3], str) and out[3] == pool.HELD)
        return out

    def recorded_pack(self, payloads, uses=None):  # type: ignore[no-untyped-def]
        packed = pack(self, payloads, uses)

        def inner(site, slot):  # type: ignore[no-untyped-def]
            out = packed(site, slot)
            blobs.append(out[1] is None)
            return out

        return inner

    monkeypatch.setattr(pool.ParallelLink, "_site_args", recorded_site_args)
    monkeypatch.setattr(pool.ParallelLink, "_pack", recorded_pack)
    spec, sites = toy_federation(2, size=32)
    cls = get_method("fedlppa")
    sim = Simulation(cls(cls.Config(), spec), sites, TRAIN, seed=3, workers=2, threads=1)
    try:
        sim.round(0)
        sim.evaluate(REGIONS)
        first = len(states)
        sim.round(1)
        sim.evaluate(REGIONS)
    finally:
        sim.close()
    assert first == 4 and len(states) == 8  # 2 sites x (train + evaluate) per round
    assert not any(states[:2])  # round 1: every process gets the initial state
    assert any(states[first:]) and any(blobs)


def test_a_request_pickles_each_payload_once_and_processes_keep_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A payload shared by sites is pickled once per request and dropped after its last job;
    a process keeps the payloads of the request up to PAYLOAD_CACHE_BYTES (least recently
    used dropped first), and is told which it keeps."""
    from fedseg.engine import pool

    shared = Payload({"w": torch.zeros(100)})
    own = Payload({"w": torch.ones(100)})
    tokens = {"s0": 1, "s1": 1, "s2": 1, "s3": 2}
    payloads = {"s0": shared, "s1": shared, "s2": shared, "s3": own}
    a, b = pool._Slot(None), pool._Slot(None)  # type: ignore[arg-type]
    packer = pool._Packer(tokens, payloads)
    t0, blob0, keep0 = packer("s0", a)
    assert (t0, keep0) == (1, frozenset({1})) and 1 in packer.blobs
    _, blob1, _ = packer("s1", b)
    assert blob1 is blob0  # pickled once
    _, blob2, keep2 = packer("s2", a)
    assert blob2 is None and keep2 == {1}  # a holds it: token only
    assert packer.blobs == {}  # the shared payload's last job: dropped
    monkeypatch.setattr(pool, "PAYLOAD_CACHE_BYTES", len(blob0) + 1)
    _, blob3, keep3 = packer("s3", a)  # over the budget: a drops the older payload
    assert blob3 is not None and keep3 == {2}
    assert list(a.payloads) == [2] and packer.blobs == {}
    # the next request: payloads not in it are dropped, a held one goes by token
    again = pool._Packer({"s3": 2}, {"s3": own})
    assert again("s3", a)[1] is None and list(a.payloads) == [2]
    fresh = pool._Packer({"s3": 2}, {"s3": own})
    _, blob, keep = fresh("s3", b)  # b held the shared payload only: dropped, s3 sent
    assert blob is not None and keep == {2} and list(b.payloads) == [2]


def test_processes_with_a_small_payload_budget_give_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for one payload per process, FedLPPA's per-site payloads are sent again
    when needed; results stay those of the sequential engine."""
    from fedseg.engine import pool

    monkeypatch.setattr(pool, "PAYLOAD_CACHE_BYTES", 1)
    seq, _, seq_ev = _run("fedlppa", 1)
    par, _, par_ev = _run("fedlppa", 2)
    _assert_equal(seq.states, par.states, "private states")
    _assert_equal(seq_ev, par_ev, "evaluation")


def test_parallel_replies_come_one_by_one_in_site_order() -> None:
    """The worker pool hands replies over as they come back, in site order, so the server
    reduces (and drops) each upload while later sites train: of 6 uploads, at most the
    workers' few are alive at once."""
    import gc
    import weakref

    spec, sites = toy_federation(6, size=32)
    cls = get_method("fedavg")
    sim = Simulation(cls(cls.Config(), spec), sites, TRAIN, seed=3, workers=2, threads=1)
    try:
        replies = sim.link.train(0, sim.payloads)
        assert not isinstance(replies, dict)
        refs, alive, order = [], [], []
        for name, reply in replies:
            order.append(name)
            refs.append(weakref.ref(reply.upload.tensors["decoder.head.weight"]))
            del reply
            gc.collect()
            alive.append(sum(r() is not None for r in refs))
    finally:
        sim.close()
    assert order == list(sim.payloads)
    assert max(alive) <= 3
