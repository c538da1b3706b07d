"""HarmoFL's UNet (``model: harmofl_unet``): the architecture FedBCS and HarmoFL train."""

import pytest
import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.models.registry import list_models, parse_model
from fedseg.models.unet import UNet


def _net(in_channels: int = 3, num_classes: int = 2) -> nn.Module:
    return parse_model({"name": "harmofl_unet"}).build(in_channels, num_classes, 2)


def test_parameter_count_is_pinned():
    # 3-channel inputs (nuclei RGB, prostate 3 adjacent slices), 2 classes, as in FedBCS
    assert sum(p.numel() for p in _net().parameters()) == 7_757_186
    assert sum(p.numel() for p in _net(1, 2).parameters()) == 7_756_610
    # the default UNet is unchanged by the new options
    assert sum(p.numel() for p in UNet(1, 2).parameters()) == 1_813_474


def test_architecture_matches_harmofl():
    net = _net()
    assert "harmofl_unet" in list_models()
    convs = [m for m in net.modules() if type(m) is nn.Conv2d]
    three = [m for m in convs if m.kernel_size == (3, 3)]
    assert len(three) == 18 and all(m.bias is None for m in three)  # 9 blocks x 2, bias-free
    assert [m.out_channels for m in three[::2][:5]] == [32, 64, 128, 256, 512]
    head = net.decoder.head
    assert head.kernel_size == (1, 1) and head.bias is not None and head.out_channels == 2
    ups = [m for m in net.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert [(m.in_channels, m.out_channels) for m in ups] == [
        (512, 256),
        (256, 128),
        (128, 64),
        (64, 32),
    ]
    assert all(m.kernel_size == (2, 2) and m.stride == (2, 2) for m in ups)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 18 and all(not m.affine and not m.track_running_stats for m in bns)
    assert not any(
        isinstance(m, nn.LeakyReLU | nn.Dropout) and getattr(m, "p", 0) for m in net.modules()
    )
    assert any(isinstance(m, nn.ReLU) for m in net.modules())
    assert not list(net.buffers())  # nothing but trainable weights travels


def test_forward_shapes_and_features():
    net = _net()
    out = net.forward_features(torch.randn(2, 3, 32, 32))
    assert out.logits.shape == (2, 2, 32, 32)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes["enc1"] == (32, 32, 32) and shapes["enc5"] == (512, 2, 2)
    assert shapes["dec4"] == (256, 4, 4) and shapes["dec1"] == (32, 32, 32)


def test_evaluation_uses_batch_statistics():
    # no running statistics: in eval mode a sample's output depends on its batch
    torch.manual_seed(0)
    net = _net().eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        alone, in_batch = net(x[:1]), net(x)[:1]
    assert not torch.allclose(alone, in_batch, atol=1e-4)


def test_encoder_post_module_feeds_pool_and_skip():
    net = _net()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = net(x)
        net.encoder.post["enc2"] = nn.Identity()
        assert torch.equal(net(x), ref)  # an identity post-module changes nothing
        net.encoder.post["enc2"] = nn.Hardtanh(-0.1, 0.1)
        feats = net.forward_features(x).features
    assert feats["enc2"].abs().max() <= 0.1  # the returned level is the post-module's output
    assert not torch.allclose(net(x), ref)


def test_bad_widths_name_the_field():
    with pytest.raises(ConfigError, match=r"model\.widths"):
        parse_model({"name": "harmofl_unet", "widths": [32]})
    with pytest.raises(ConfigError, match=r"model\.dropout"):
        parse_model({"name": "harmofl_unet", "dropout": [0.1]})
