import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
HEAD = {"decoder.head.weight", "decoder.head.bias"}


def _sim(**cfg) -> Simulation:
    spec, sites = toy_federation(2)
    cls = get_method("fedrep")
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=0)


def _step(sim: Simulation, site: str = "site0", r: int = 0):
    return sim.method.client_step(
        sim.payloads[site], sim.states[site], sim.context(sim.sites[site], r)
    )


def test_head_phase_then_body_phase_with_the_other_part_frozen():
    sim = _sim(head_iters=2, body_iters=1)
    phases = []
    original = sim.method.local_train

    def spy(model, ctx, **kw):
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        phases.append(
            (
                trainable,
                {n for n, p in model.named_parameters() if any(p is q for q in kw["params"])},
                kw["iters"],
            )
        )
        return original(model, ctx, **kw)

    sim.method.local_train = spy
    _step(sim)
    names = {n for n, _ in sim.model.named_parameters()}
    assert phases == [(HEAD, HEAD, 2), (names - HEAD, names - HEAD, 1)]
    assert all(p.requires_grad for p in sim.model.parameters())  # restored afterwards


def test_head_only_round_leaves_body_untouched_and_keeps_head_local():
    sim = _sim(head_iters=3, body_iters=0)
    glob = sim.payloads["site0"].tensors
    res = _step(sim)
    params = dict(sim.model.named_parameters())
    body = set(params) - HEAD
    assert all(torch.equal(res.upload.tensors[k], glob[k]) for k in body)
    assert not torch.equal(
        res.state["weights"]["decoder.head.weight"],
        sim.states["site0"]["weights"]["decoder.head.weight"],
    )
    assert not HEAD & set(res.upload.tensors)


def test_head_never_uploaded_and_personal_after_rounds():
    sim = _sim()
    for r in range(TRAIN.rounds):
        sim.round(r)
    assert all(not HEAD & set(p.tensors) for p in sim.payloads.values())
    heads = [sim.states[s]["weights"]["decoder.head.weight"] for s in ("site0", "site1")]
    assert not torch.equal(*heads)
    key = "encoder.blocks.0.1.running_mean"  # BN statistics belong to the shared body
    torch.testing.assert_close(
        sim.payloads["site0"].tensors[key], sim.payloads["site1"].tensors[key]
    )


def test_communication_matches_fedlppa_table_ix():
    parts = get_method("fedrep").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_184, "download": 1_813_184}
    assert set(parts.private) == HEAD


def test_both_phases_empty_is_rejected():
    with pytest.raises(ValueError, match="nothing would be trained"):
        get_method("fedrep").Config(head_iters=0, body_iters=0)


def test_joint_schedule_trains_head_and_body_together_and_keeps_head_local():
    sim = _sim(schedule="joint")
    calls = []
    original = sim.method.local_train

    def spy(model, ctx, **kw):
        calls.append((kw, {n for n, p in model.named_parameters() if p.requires_grad}))
        return original(model, ctx, **kw)

    sim.method.local_train = spy
    glob = sim.payloads["site0"].tensors
    res = _step(sim)
    names = {n for n, _ in sim.model.named_parameters()}
    assert calls == [({}, names)]  # one phase, every weight trainable, train.local_iters steps
    assert not HEAD & set(res.upload.tensors)
    assert not torch.equal(
        res.upload.tensors["encoder.blocks.0.0.weight"], glob["encoder.blocks.0.0.weight"]
    )
    assert not torch.equal(
        res.state["weights"]["decoder.head.weight"],
        sim.states["site0"]["weights"]["decoder.head.weight"],
    )
    assert set(res.metrics) == {"loss"}


def test_joint_schedule_rejects_phase_lengths():
    with pytest.raises(ValueError, match="schedule: alternating only"):
        get_method("fedrep").Config(schedule="joint", head_iters=2)


def test_phases_default_to_one_round_of_steps_under_local_epochs():
    sim = _sim()
    sim.train = TrainSettings(rounds=2, local_epochs=1, batch_size=4, augment=False)
    iters = []
    original = sim.method.local_train

    def spy(model, ctx, **kw):
        iters.append(kw["iters"])
        return original(model, ctx, **kw)

    sim.method.local_train = spy
    _step(sim, "site1")  # 10 samples, batch 4: 3 steps per pass
    assert iters == [3, 3]


def test_head_epochs_lengthen_the_head_phase_only():
    sim = _sim(head_epochs=3)
    sim.train = TrainSettings(rounds=2, local_epochs=1, batch_size=4, augment=False)
    iters = []
    original = sim.method.local_train

    def spy(model, ctx, **kw):
        iters.append(kw["iters"])
        return original(model, ctx, **kw)

    sim.method.local_train = spy
    _step(sim, "site1")  # 3 steps per pass: 3 head passes, then 1 body pass
    assert iters == [9, 3]
    cfg = get_method("fedrep").Config
    with pytest.raises(ValueError, match="not both"):
        cfg(head_iters=2, head_epochs=3)
    with pytest.raises(ValueError, match="schedule: alternating only"):
        cfg(schedule="joint", head_epochs=10)
