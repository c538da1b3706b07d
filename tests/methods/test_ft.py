import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=1, local_iters=2, batch_size=4, augment=False)


def _sim(train: TrainSettings = TRAIN, **cfg) -> Simulation:
    spec, sites = toy_federation(2)
    cls = get_method("ft")
    sim = Simulation(cls(cls.Config(**cfg), spec), sites, train, seed=0)
    sim.round(0)
    return sim


def _eval_weights(sim: Simulation, site: str) -> dict[str, torch.Tensor]:
    model = sim.eval_model(site)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_fine_tuning_changes_eval_weights_but_not_stored_state():
    sim = _sim(ft_iters=3)
    payload = {k: v.clone() for k, v in sim.payloads["site0"].tensors.items()}
    state = {k: v.clone() for k, v in sim.states["site0"]["weights"].items()}
    tuned = _eval_weights(sim, "site0")
    changed = [k for k in payload if not torch.equal(tuned[k], payload[k])]
    assert "encoder.blocks.0.0.weight" in changed and "decoder.head.weight" in changed
    assert all(torch.equal(sim.payloads["site0"].tensors[k], v) for k, v in payload.items())
    assert all(torch.equal(sim.states["site0"]["weights"][k], v) for k, v in state.items())
    again = _eval_weights(sim, "site0")  # starts from the same stored model again
    assert all(torch.equal(again[k], v) for k, v in tuned.items())
    other = _eval_weights(sim, "site1")
    assert not torch.equal(other["decoder.head.weight"], tuned["decoder.head.weight"])


def test_zero_iterations_evaluate_the_fedavg_model():
    sim = _sim(ft_iters=0)
    tuned = _eval_weights(sim, "site0")
    assert all(torch.equal(tuned[k], v) for k, v in sim.payloads["site0"].tensors.items())


def test_head_scope_fine_tunes_only_the_head():
    sim = _sim(ft_iters=2, ft_scope="head")
    payload = sim.payloads["site0"].tensors
    tuned = _eval_weights(sim, "site0")
    params = dict(sim.model.named_parameters())
    changed = {k for k in params if not torch.equal(tuned[k], payload[k])}
    assert changed == {"decoder.head.weight", "decoder.head.bias"}


def test_communication_is_fedavg():
    parts = get_method("ft").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_474, "download": 1_813_474}
    assert get_method("ft").personalized


def test_learning_rate_defaults_to_the_last_rounds_rate():
    train = TrainSettings(rounds=40, lr=0.005)
    cfg = get_method("ft").Config
    assert cfg().lr(train) == pytest.approx(0.005 * (1 / 40) ** 0.9)
    assert cfg(ft_lr="base").lr(train) == 0.005
    assert cfg(ft_lr=None).ft_lr == "base"  # configs written before "last" became the default
    assert cfg(ft_lr=2e-4).lr(train) == 2e-4
    constant = train.model_copy(update={"lr_schedule": "constant"})
    assert cfg().lr(constant) == 0.005
    with pytest.raises(ValueError):
        cfg(ft_lr=0)


def test_a_smaller_rate_moves_the_model_less():
    def moved(ft_lr) -> float:
        sim = _sim(TRAIN.model_copy(update={"rounds": 4}), ft_iters=3, ft_lr=ft_lr)
        start = sim.payloads["site0"].tensors["decoder.head.weight"]
        return (_eval_weights(sim, "site0")["decoder.head.weight"] - start).abs().sum().item()

    assert 0 < moved("last") < moved("base")
