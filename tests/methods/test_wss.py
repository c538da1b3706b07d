import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import TrainSettings, get_method
from fedseg.methods import wss as wss_module
from fedseg.models.dual_decoder import DualDecoderUNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
AUX_CONV = "aux_decoder.ups.0.conv.0.weight"
AUX_BN = "aux_decoder.ups.0.conv.1.weight"
AUX_HEAD = "aux_decoder.head.weight"
EXTRA = {"fedala": {"num_pre_loss": 1, "max_start_passes": 2}}


def test_dual_decoder_model_counts_inits_and_evaluates_main_decoder():
    torch.manual_seed(0)
    net = DualDecoderUNet(1, 2).eval()
    assert sum(p.numel() for p in net.parameters()) == 1_813_474 + 633_010
    # Kaiming-normal init with zero biases vs PyTorch's default init
    assert float(net.aux_decoder.head.bias.detach().abs().sum()) == 0
    assert float(net.decoder.head.bias.detach().abs().sum()) > 0
    x = torch.randn(2, 1, 32, 32)
    main, aux = net.forward_dual(x)
    torch.testing.assert_close(net(x), main)
    assert not torch.allclose(main, aux)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedbn", "fedrep", "fedala"])
def test_dual_decoder_option_trains_two_rounds(name, monkeypatch):
    calls = []
    real = wss_module.dual_decoder_loss

    def counting(*args, **kw):
        out = real(*args, **kw)
        calls.append(out[1])
        return out

    monkeypatch.setattr(wss_module, "dual_decoder_loss", counting)
    spec, sites = toy_federation(2, n_train=4, n_test=2)
    cls = get_method(name)
    sim = Simulation(
        cls(cls.Config(wss="dual_decoder", **EXTRA.get(name, {})), spec), sites, TRAIN, seed=0
    )
    assert isinstance(sim.model, DualDecoderUNet)
    init = sim.model.aux_decoder.state_dict()
    records = [sim.round(r) for r in range(TRAIN.rounds)]
    assert calls and all(0.7 <= c["mix"] <= 1.0 for c in calls)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in records[-1]["clients"].values())
    state, payload = sim.states["site0"], sim.payloads["site0"].tensors
    weights = {**payload, **state["weights"]}
    assert not torch.equal(weights[AUX_CONV], init["ups.0.conv.0.weight"])  # aux decoder trained
    # the auxiliary decoder follows the method's own partition
    assert AUX_CONV in payload
    assert (AUX_BN in payload) is (name != "fedbn")
    assert (AUX_HEAD in payload) is (name != "fedrep")
    ev = sim.evaluate({"fg": [1]})
    assert all(0 <= v["metrics"]["dsc"]["fg"] <= 1 for v in ev.values())


def test_single_mode_is_the_plain_unet_and_bad_mix_is_rejected():
    spec, _ = toy_federation(2)
    cls = get_method("fedavg")
    assert type(cls(cls.Config(), spec).build_model()).__name__ == "UNet"
    with pytest.raises(ValueError, match="wss_mix"):
        cls.Config(wss="dual_decoder", wss_mix=(0.9, 0.5))
    with pytest.raises(ValueError, match="wss"):
        cls.Config(wss="triple")
