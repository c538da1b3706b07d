import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
HEAD = {"decoder.head.weight", "decoder.head.bias"}


def _sim(**cfg) -> Simulation:
    spec, sites = toy_federation(2, labels="full")
    cls = get_method("fedbabu")
    return Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=0)


def _head(sim: Simulation, site: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in sim.states[site]["weights"].items() if k in HEAD}


def test_head_never_changes_during_federation_and_body_is_averaged():
    sim = _sim()
    start = _head(sim, "site0")
    assert set(start) == HEAD
    for r in range(TRAIN.rounds):
        body_before = {k: v.clone() for k, v in sim.payloads["site0"].tensors.items()}
        sim.round(r)
        for site in ("site0", "site1"):
            assert all(torch.equal(v, start[k]) for k, v in _head(sim, site).items())
        assert not HEAD & set(sim.payloads["site0"].tensors)
        changed = [
            k
            for k, v in sim.payloads["site0"].tensors.items()
            if not torch.equal(v, body_before[k])
        ]
        assert "encoder.blocks.0.0.weight" in changed  # the body trains
    assert sim.payloads["site0"] is sim.payloads["site1"]  # one global body


def test_evaluation_fine_tuning_changes_head_and_body_but_not_the_stored_model():
    sim = _sim(ft_epochs=2)
    sim.round(0)
    stored = {k: v.clone() for k, v in sim.payloads["site0"].tensors.items()}
    head = _head(sim, "site0")
    tuned = {k: v.clone() for k, v in sim.eval_model("site0").state_dict().items()}
    assert not torch.equal(tuned["decoder.head.weight"], head["decoder.head.weight"])
    assert not torch.equal(tuned["encoder.blocks.0.0.weight"], stored["encoder.blocks.0.0.weight"])
    assert all(torch.equal(sim.payloads["site0"].tensors[k], v) for k, v in stored.items())
    assert all(torch.equal(v, head[k]) for k, v in _head(sim, "site0").items())


def test_no_fine_tuning_evaluates_the_federated_model_and_head_scope_tunes_only_the_head():
    sim = _sim(ft_epochs=0)
    sim.round(0)
    plain = sim.eval_model("site0").state_dict()
    assert all(torch.equal(plain[k], v) for k, v in sim.payloads["site0"].tensors.items())
    assert all(torch.equal(plain[k], v) for k, v in _head(sim, "site0").items())
    sim = _sim(ft_epochs=1, ft_scope="head")
    sim.round(0)
    tuned = sim.eval_model("site0").state_dict()
    params = {n for n, _ in sim.model.named_parameters()}
    weights = {**sim.payloads["site0"].tensors, **sim.states["site0"]["weights"]}
    changed = {k for k in params if not torch.equal(tuned[k], weights[k])}
    assert changed == HEAD


@pytest.mark.parametrize(
    ("settings", "steps"),
    [
        ({"ft_epochs": 3}, 9),  # site1: 10 training samples, batch 4 -> 3 batches per pass
        ({"ft_epochs": 2, "ft_epoch_iters": 5}, 10),  # FedDP's code: 300 draws, any site size
    ],
)
def test_fine_tuning_steps_are_epochs_of_passes_or_of_a_fixed_step_count(settings, steps):
    sim = _sim(**settings)
    sim.round(0)
    calls = []
    original = sim.method.local_train

    def spy(model, ctx, **kw):
        calls.append((kw["iters"], ctx.train.lr_schedule))
        return original(model, ctx, **kw)

    sim.method.local_train = spy
    sim.eval_model("site1")
    assert calls == [(steps, "constant")]


def test_communication_excludes_the_head():
    parts = get_method("fedbabu").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_184, "download": 1_813_184}
    assert set(parts.private) == HEAD


def test_bad_setting_is_named():
    with pytest.raises(ValueError, match="ft_epochs"):
        get_method("fedbabu").Config(ft_epochs=-1)
    with pytest.raises(ValueError, match="ft_epoch_iters"):
        get_method("fedbabu").Config(ft_epoch_iters=0)
