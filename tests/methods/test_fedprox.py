import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import Partition, TrainSettings, get_method
from fedseg.methods.fedprox import proximal_term
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _run(name: str, **cfg) -> Simulation:
    spec, sites = toy_federation(2)
    cls = get_method(name)
    sim = Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=3)
    for r in range(TRAIN.rounds):
        sim.round(r)
    return sim


def test_mu_zero_is_fedavg_bit_for_bit():
    prox, avg = _run("fedprox", mu=0.0), _run("fedavg")
    for site in ("site0", "site1"):
        a, b = prox.payloads[site].tensors, avg.payloads[site].tensors
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_positive_mu_pulls_local_weights_towards_global():
    def drift(mu: float) -> float:
        spec, sites = toy_federation(2)
        cls = get_method("fedprox")
        sim = Simulation(cls(cls.Config(mu=mu), spec), sites, TRAIN, seed=3)
        glob = sim.payloads["site0"].tensors
        res = sim.method.client_step(
            sim.payloads["site0"], sim.states["site0"], sim.context(sim.sites["site0"], 0)
        )
        return sum(
            float((res.upload.tensors[k] - glob[k]).pow(2).sum())
            for k, _ in sim.model.named_parameters()
        )

    assert drift(5000.0) < 0.5 * drift(0.0)


def test_proximal_term_value_and_gradient_skip_buffers():
    net = UNet(1, 2)
    ref = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        net.decoder.head.bias += torch.tensor([1.0, -2.0])
        net.decoder.head.bias.grad = None
        net.encoder.blocks[0][1].running_mean += 5.0  # a buffer: never penalised
    term = proximal_term(net, ref, mu=0.4)
    value = term()
    assert value.item() == pytest.approx(0.5 * 0.4 * (1.0 + 4.0))
    value.backward()
    torch.testing.assert_close(net.decoder.head.bias.grad, torch.tensor([0.4, -0.8]))
    assert float(net.encoder.blocks[0][0].weight.grad.abs().sum()) == 0.0


def test_communication_matches_fedlppa_table_ix():
    parts = get_method("fedprox").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_813_474, "download": 1_813_474}
    assert get_method("fedprox").partition == Partition()


def test_negative_mu_is_rejected():
    with pytest.raises(ValueError, match="mu"):
        get_method("fedprox").Config(mu=-0.1)
