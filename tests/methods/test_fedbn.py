import torch
from torch import nn

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _bn_keys(model: nn.Module) -> set[str]:
    return {
        f"{name}.{k}"
        for name, m in model.named_modules()
        if isinstance(m, nn.BatchNorm2d)
        for k in m.state_dict()
    }


def test_bn_never_uploaded_and_stays_per_site():
    spec, sites = toy_federation(2)
    cls = get_method("fedbn")
    sim = Simulation(cls(cls.Config(), spec), sites, TRAIN, seed=0)
    bn = _bn_keys(sim.model)
    assert len(bn) == 18 * 5
    uploads = {}
    original = sim.method.server_step

    def spy(ups, state, ctx):
        uploads.update(ups)
        return original(ups, state, ctx)

    sim.method.server_step = spy
    for r in range(TRAIN.rounds):
        sim.round(r)
    for up in uploads.values():
        assert not bn & set(up.tensors)
        assert set(up.tensors) == set(sim.model.state_dict()) - bn
    key = "encoder.blocks.0.1.running_mean"
    a, b = (sim.states[s]["weights"][key] for s in ("site0", "site1"))
    assert not torch.equal(a, b)  # each site's own statistics
    conv = "encoder.blocks.0.0.weight"
    torch.testing.assert_close(
        sim.payloads["site0"].tensors[conv], sim.payloads["site1"].tensors[conv]
    )


def test_communication_matches_fedlppa_table_ix():
    parts = get_method("fedbn").partition.resolve(UNet(1, 2))
    assert parts.params() == {"total": 1_813_474, "upload": 1_810_530, "download": 1_810_530}


def test_3d_bn_layers_are_local_too():
    parts = get_method("fedbn").partition.resolve(UNet(1, 2, ndim=3))
    assert "encoder.blocks.0.1.running_var" in parts.private
    assert parts.params()["total"] - parts.params()["upload"] == 2_944
