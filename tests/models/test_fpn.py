"""FPN decoder and the pvtv2_fpn network: smp's parameter count, shapes, features, grads."""

import pytest
import torch

from fedseg.errors import ConfigError
from fedseg.models.features import named_features
from fedseg.models.fpn import FPNDecoder, PVTv2FPN
from fedseg.models.registry import list_models, parse_model


def test_decoder_parameter_count_equals_smp_fpn_decoder():
    dec = FPNDecoder([32, 64, 160, 256])
    assert sum(p.numel() for p in dec.parameters()) == 1_755_904
    lateral = 256 * 256 + 256 + 160 * 256 + 256 + 64 * 256 + 256 + 32 * 256 + 256
    first = 256 * 128 * 9 + 2 * 128  # conv3x3 without bias + GroupNorm
    later = 128 * 128 * 9 + 2 * 128
    assert lateral + (first + 2 * later) + (first + later) + first + first == 1_755_904


@pytest.mark.parametrize(("classes", "total"), [(1, 5_165_793), (2, 5_165_922)])
def test_whole_network_counts(classes, total):
    net = parse_model({"name": "pvtv2_fpn"}).build(3, classes, 2)
    assert "pvtv2_fpn" in list_models()
    assert sum(p.numel() for p in net.parameters()) == total
    head = [k for k in net.state_dict() if k.startswith("decoder.head.")]
    assert head == ["decoder.head.weight", "decoder.head.bias"]


def test_output_and_named_features_at_64_px():
    net = PVTv2FPN(3, 3).eval()
    x = torch.randn(2, 3, 64, 64)
    logits, feats = named_features(net, x)
    assert logits.shape == (2, 3, 64, 64)
    assert torch.equal(logits, net(x))
    shapes = {k: tuple(v.shape[1:]) for k, v in feats.items()}
    assert shapes == {
        "enc1": (32, 16, 16),
        "enc2": (64, 8, 8),
        "enc3": (160, 4, 4),
        "enc4": (256, 2, 2),
        "dec4": (256, 2, 2),
        "dec3": (256, 4, 4),
        "dec2": (256, 8, 8),
        "dec1": (256, 16, 16),
        "fpn": (128, 16, 16),
    }


def test_sizes_not_divisible_by_32_still_segment():
    net = PVTv2FPN(1, 2).eval()
    assert net(torch.randn(1, 1, 48, 40)).shape == (1, 2, 48, 40)


def test_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    net = PVTv2FPN(3, 2).train()
    y = torch.randint(0, 2, (2, 64, 64))
    torch.nn.functional.cross_entropy(net(torch.randn(2, 3, 64, 64)), y).backward()
    for n, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, n


def test_options_validated_naming_the_field():
    with pytest.raises(ConfigError, match=r"model.segmentation_channels"):
        parse_model({"name": "pvtv2_fpn", "segmentation_channels": 100})
    with pytest.raises(ConfigError, match=r"model.bogus"):
        parse_model({"name": "pvtv2_fpn", "bogus": 1})
    with pytest.raises(ConfigError, match=r"2D only"):
        parse_model({"name": "pvtv2_fpn"}).build(1, 2, 3)
    small = parse_model({"name": "pvtv2_fpn", "pyramid_channels": 64, "segmentation_channels": 32})
    assert small.build(3, 2, 2)(torch.randn(1, 3, 64, 64)).shape == (1, 2, 64, 64)
    with pytest.raises(ConfigError, match=r"model.decoder_init"):
        parse_model({"name": "pvtv2_fpn", "decoder_init": "xavier"})


def test_decoder_init_kaiming_as_smp_or_torch_default_as_feddp_code():
    """``kaiming``: He-uniform weights (bound sqrt(6 / fan_in)) and zero biases; ``torch``:
    PyTorch's defaults (weights and biases within 1 / sqrt(fan_in)), what FedDP's code gets
    from a bare ``FPNDecoder``. The lateral 1x1 ``p5`` (fan_in 256) shows both."""
    torch.manual_seed(0)
    kaiming = parse_model({"name": "pvtv2_fpn"}).build(3, 2, 2).decoder.fpn.p5
    torch.manual_seed(0)
    plain = parse_model({"name": "pvtv2_fpn", "decoder_init": "torch"}).build(3, 2, 2)
    p5 = plain.decoder.fpn.p5
    bound = 256**-0.5
    assert torch.equal(kaiming.bias, torch.zeros(256))
    assert kaiming.weight.abs().max() > 2 * bound
    assert kaiming.weight.abs().max() <= 6**0.5 * bound
    assert p5.weight.abs().max() <= bound and p5.bias.abs().max() <= bound
    assert p5.bias.abs().min() > 0


def test_upsample_probabilities_interpolates_the_softmax_as_feddps_code():
    """``probabilities``: a softmax of the output is the bilinear x4 up-sampling of the
    head's probabilities (the code: sigmoid, then ``F.interpolate``; on two classes the
    softmax is the sigmoid of the logit difference); ``logits`` up-samples the logits."""
    torch.manual_seed(0)
    net = parse_model({"name": "pvtv2_fpn", "upsample": "probabilities"}).build(3, 2, 2).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        out = net(x)
        head = net.decoder.head(net.decoder.fpn.merge(net.decoder.fpn.pyramid(net.encode(x), [])))
        sig = torch.sigmoid(head[:, 1:] - head[:, :1])  # the code's one sigmoid channel
        code = torch.nn.functional.interpolate(sig, size=(64, 64), mode="bilinear")
        net.upsample = "logits"
        plain = net(x)
    assert out.shape == plain.shape == (2, 2, 64, 64)
    assert torch.allclose(out.softmax(1)[:, 1:], code, atol=1e-6)
    assert not torch.allclose(plain.softmax(1)[:, 1:], code, atol=1e-4)
    with pytest.raises(ConfigError, match=r"model\.upsample"):
        parse_model({"name": "pvtv2_fpn", "upsample": "nearest"})
