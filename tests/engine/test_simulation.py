import gc
import weakref

import pytest
import torch

from fedseg.engine.loop import RoundPolicy
from fedseg.engine.simulation import Simulation
from fedseg.errors import UploadError
from fedseg.methods import Payload, TrainSettings, get_method
from fedseg.methods.base import TensorSpec, validate_upload
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
REGIONS = {"fg": [1]}


def _sim(name: str, seed: int = 0, labels: str = "weak") -> Simulation:
    spec, sites = toy_federation(3, labels=labels)
    cls = get_method(name)
    method = cls(cls.Config(), Simulation.method_spec(cls, spec, sites))
    return Simulation(method, sites, TRAIN, seed=seed)


def _train(sim: Simulation) -> list[dict]:
    return [sim.round(r) for r in range(TRAIN.rounds)]


def test_fedavg_global_model_is_sample_weighted_mean_of_uploads():
    sim = _sim("fedavg")
    captured = {}
    original = sim.method.aggregator

    def spy(state, ctx):
        agg = original(state, ctx)
        add = agg.add

        def record(site, upload):
            tensors = {k: v.clone() for k, v in upload.tensors.items()}
            captured[site] = Payload(tensors, num_examples=upload.num_examples)
            add(site, upload)

        agg.add = record
        return agg

    sim.method.aggregator = spy
    sim.round(0)
    n = {s: u.num_examples for s, u in captured.items()}
    key = "decoder.head.weight"
    expected = sum(captured[s].tensors[key] * n[s] for s in n) / sum(n.values())
    for payload in sim.payloads.values():
        torch.testing.assert_close(payload.tensors[key], expected)
    assert n == {"site0": 8, "site1": 10, "site2": 12}
    # the streaming average equals the method's own server step on the same uploads
    direct = sim.method.server_step(captured, {}, _ctx(sim, 0))
    for k, v in direct.payloads["site0"].tensors.items():
        assert torch.equal(v, sim.payloads["site0"].tensors[k]), k


def _ctx(sim: Simulation, r: int):
    from fedseg.methods.base import ServerContext

    return ServerContext(sim.method.spec, r, TRAIN, torch.Generator())


def test_fedavg_server_holds_one_upload_at_a_time():
    """In-process sites hand over their uploads one by one and FedAvg reduces each on
    arrival: while a site trains, at most the previous site's upload is still alive."""
    spec, sites = toy_federation(4)
    cls = get_method("fedavg")
    sim = Simulation(cls(cls.Config(), spec), sites, TRAIN, seed=0)
    refs: list[weakref.ref] = []
    alive_at_start: list[int] = []
    for worker in sim.link.workers.values():

        def train(r, payload, _orig=worker.train):
            gc.collect()
            alive_at_start.append(sum(ref() is not None for ref in refs))
            res, start = _orig(r, payload)
            refs.append(weakref.ref(res.upload.tensors["decoder.head.weight"]))
            return res, start

        worker.train = train
    sim.round(0)
    assert alive_at_start == [0, 1, 1, 1]


def test_sites_release_their_initial_state_after_the_first_step():
    """Memory holds one private state per site: after a site's first step its state before
    round 1 is freed (the in-memory store never goes back to it)."""
    spec, sites = toy_federation(3)
    cls = get_method("fedlppa")
    config = cls.Config(la_skip_rounds=0)  # LA replaces the initial weights in round 1
    sim = Simulation(cls(config, Simulation.method_spec(cls, spec, sites)), sites, TRAIN)
    refs = {
        name: weakref.ref(next(iter(w.initial["method"]["la"].values())))
        for name, w in sim.link.workers.items()
    }
    sim.round(0)
    gc.collect()
    assert all(w.initial is None for w in sim.link.workers.values())
    assert all(ref() is None for ref in refs.values())
    sim.round(1)  # later rounds start from the saved states
    assert all(w.store.saved[0] == 1 for w in sim.link.workers.values())


def test_a_store_that_replays_keeps_the_initial_state(tmp_path):
    """A site whose store can replay an earlier round (a Flower site's files, after the
    server resumed from an older checkpoint) keeps its state before round 1."""
    from fedseg.engine.site_state import SiteStateStore

    spec, sites = toy_federation(2)
    cls = get_method("fedbn")
    sim = Simulation(cls(cls.Config(), spec), sites, TRAIN)
    worker = sim.link.workers["site0"]
    worker.store = SiteStateStore(tmp_path / "site0")
    payload = sim.payloads["site0"]
    first, _ = worker.train(0, payload)
    assert worker.initial is not None
    replay, start = worker.train(0, payload)  # round 1 again: from the initial state
    assert start == -1
    for key, value in first.upload.tensors.items():
        assert torch.equal(value, replay.upload.tensors[key]), key


def test_fedavg_learns_and_evaluates_every_site():
    sim = _sim("fedavg")
    records = _train(sim)
    assert [r["participants"] for r in records] == [["site0", "site1", "site2"]] * 2
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in records[-1]["clients"].values())
    ev = sim.evaluate(REGIONS)
    assert set(ev) == {"site0", "site1", "site2"}
    assert all(v["cases"] == 4 and 0 <= v["metrics"]["dsc"]["fg"] <= 1 for v in ev.values())


def test_same_seed_same_weights_other_seed_differs():
    a, b, c = _sim("fedavg", 1), _sim("fedavg", 1), _sim("fedavg", 2)
    for s in (a, b, c):
        _train(s)
    key = "encoder.blocks.0.0.weight"
    torch.testing.assert_close(
        a.payloads["site0"].tensors[key], b.payloads["site0"].tensors[key], rtol=0, atol=0
    )
    assert not torch.equal(a.payloads["site0"].tensors[key], c.payloads["site0"].tensors[key])


def test_local_training_sends_nothing_and_keeps_models_apart():
    sim = _sim("local")
    _train(sim)
    assert sim.params["upload"] == sim.params["download"] == 0
    w = [sim.states[s]["weights"]["decoder.head.weight"] for s in ("site0", "site1")]
    assert not torch.equal(w[0], w[1])
    assert all(p.tensors == {} for p in sim.payloads.values())


def test_centralized_trains_one_pooled_model_and_scores_each_site():
    sim = _sim("centralized", labels="full")
    assert list(sim.train_sites) == ["pooled"]
    assert sim.train_sites["pooled"].spec.num_train == 8 + 10 + 12
    _train(sim)
    assert set(sim.evaluate(REGIONS)) == {"site0", "site1", "site2"}


def test_engine_rejects_malformed_upload():
    template = {"w": TensorSpec((2,), torch.float32)}
    validate_upload("a", Payload({"w": torch.zeros(2)}, num_examples=1), template)
    bad = [
        (Payload({"w": torch.zeros(3)}, num_examples=1), "should be torch.float32 \\[2\\]"),
        (Payload({"w": torch.zeros(2, 1)}, num_examples=1), "should be"),
        (Payload({"w": torch.tensor([0.0, float("nan")])}, num_examples=1), "non-finite"),
        (Payload({"w": torch.zeros(2), "x": torch.zeros(1)}, num_examples=1), "unknown keys"),
        (Payload({"w": torch.zeros(2)}, num_examples=0), "num_examples"),
        (Payload({"w": torch.zeros(2)}, {"m": float("inf")}, 1), "non-finite metrics"),
    ]
    for payload, msg in bad:
        with pytest.raises(UploadError, match=msg):
            validate_upload("a", payload, template)


def test_variable_dimensions_are_checked_by_rank_and_fixed_dims():
    template = {"protos": TensorSpec((None, 4), torch.float32)}
    for k in (0, 1, 7):
        validate_upload("a", Payload({"protos": torch.zeros(k, 4)}, num_examples=1), template)
    for shape in ((3, 5), (3,), (1, 3, 4)):
        with pytest.raises(UploadError, match=r"should be torch.float32 \[\*, 4\]"):
            validate_upload("a", Payload({"protos": torch.zeros(shape)}, num_examples=1), template)


def test_upload_claiming_more_examples_than_declared_is_refused():
    sim = _sim("fedavg")
    lie = sim.method.client_step

    def claim_a_billion(payload, state, ctx):
        res = lie(payload, state, ctx)
        if ctx.site.name == "site2":
            res.upload.num_examples = 10**9
        return res

    sim.method.client_step = claim_a_billion
    sim.loop.policy = RoundPolicy(min_sites=2)
    record = sim.round(0)
    assert record["participants"] == ["site0", "site1"]
    assert "declared 12 training samples" in record["failures"]["site2"]


def test_centralized_makes_as_many_steps_as_the_federation():
    spec, sites = toy_federation(3, labels="full")
    cls = get_method("centralized")
    steps = {}
    for match in (True, False):
        method = cls(
            cls.Config(match_federation_steps=match), Simulation.method_spec(cls, spec, sites)
        )
        assert method.spec.pooled_sites == 3
        sim = Simulation(method, sites, TRAIN, seed=0)
        ctx = sim.context(sim.train_sites["pooled"], 0)
        steps[match] = method.iterations(ctx)
    assert steps == {True: 3 * TRAIN.local_iters, False: TRAIN.local_iters}
