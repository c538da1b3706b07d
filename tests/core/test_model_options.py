"""The ``model:`` block: UNet widths, normalisation and head; named features; the
evaluation hook for networks with more output channels than classes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.evaluation import evaluate
from fedseg.methods import TrainSettings
from fedseg.methods.fedavg import FedAvg
from fedseg.models import UNet, parse_model
from fedseg.models.features import named_features
from fedseg.testing import toy_federation


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_default_model_is_the_fedlppa_unet():
    assert _count(parse_model(None).build(1, 2, 2)) == 1_813_474


def test_harmofl_style_options_change_the_network():
    cfg = parse_model(
        {"widths": [32, 64, 128, 256, 512], "dropout": [0] * 5, "norm": "batch_stats",
         "head_kernel": 1}
    )  # fmt: skip
    net = cfg.build(3, 2, 2)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(not m.affine and not m.track_running_stats for m in bns)
    assert net.decoder.head.kernel_size == (1, 1)
    affine = 2 * sum(m.num_features for m in bns)  # the BN parameters the default would add
    wide = UNet(3, 2, channels=(32, 64, 128, 256, 512), dropout_p=(0,) * 5, head_kernel=1)
    assert _count(net) == _count(wide) - affine
    assert not any(k.endswith("running_mean") for k in net.state_dict())


@pytest.mark.parametrize("norm, layer", [("instance", nn.InstanceNorm3d), ("group", nn.GroupNorm)])
def test_other_normalisations_in_3d(norm, layer):
    net = parse_model({"norm": norm, "widths": [8, 16, 32], "dropout": [0, 0, 0]}).build(1, 2, 3)
    assert any(isinstance(m, layer) for m in net.modules())
    assert net(torch.randn(2, 1, 16, 16, 16)).shape == (2, 2, 16, 16, 16)


def test_named_features_of_the_unet_and_by_hooks():
    net = UNet(1, 2).eval()
    x = torch.randn(1, 1, 32, 32)
    logits, feats = named_features(net, x, ["enc1", "enc5", "dec1"])
    assert torch.equal(logits, net(x))
    assert feats["enc1"].shape == (1, 16, 32, 32) and feats["enc5"].shape == (1, 256, 2, 2)
    assert feats["dec1"].shape == (1, 16, 32, 32)
    _, all_feats = named_features(net, x)
    assert list(all_feats) == [*(f"enc{i}" for i in range(1, 6)), "dec4", "dec3", "dec2", "dec1"]
    plain = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    out, hooked = named_features(plain, x, ["1"])
    assert torch.equal(hooked["1"], torch.relu(plain[0](x))) and out.shape == (1, 2, 32, 32)
    with pytest.raises(ConfigError, match="has no features"):
        named_features(net, x, ["enc9"])


class _ExtraChannels(FedAvg):
    """A network with two more output channels than classes; ``segment`` ignores them."""

    def build_model(self) -> nn.Module:
        s = self.spec
        return UNet(s.in_channels, s.num_classes + 2, ndim=s.ndim)

    def segment(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return model(images)[:, : self.spec.num_classes].argmax(1)


def test_evaluation_uses_the_methods_segment_hook():
    spec, sites = toy_federation(2, labels="full")
    train = TrainSettings(rounds=1, local_iters=1, batch_size=4, augment=False, loss="pce")
    method = _ExtraChannels(FedAvg.Config(), spec)
    sim = Simulation(method, sites, train, seed=0)
    with torch.no_grad():  # make the extra channels win every pixel under a plain argmax
        sim.model.decoder.head.bias[2:] = 1e6
    sim.server.payloads = {
        s: type(p)({**p.tensors, "decoder.head.bias": sim.model.decoder.head.bias.clone()})
        for s, p in sim.payloads.items()
    }
    calls: list[int] = []
    hook = method.segment

    def spy(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        labels = hook(model, images)
        calls.append(int(model(images).argmax(1).max()))  # what a plain argmax would give
        return labels

    method.segment = spy  # type: ignore[method-assign]
    ev = sim.evaluate({"fg": [1]})
    assert calls and min(calls) >= 2  # every plain argmax would have picked an extra channel
    model = sim.eval_model("site0")
    expected = evaluate(
        model, sites["site0"].test_images, sites["site0"].test_masks, {"fg": [1]},
        batch_size=16, device=torch.device("cpu"), segment=hook,
    )  # fmt: skip
    assert ev["site0"]["metrics"] == expected.metrics
