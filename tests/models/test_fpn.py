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
    net = parse_model({"name": "pvtv2_fpn", "upsample": "logits"}).build(3, classes, 2)
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
    kaiming = parse_model({"name": "pvtv2_fpn", "decoder_init": "kaiming"}).build(3, 2, 2)
    kaiming = kaiming.decoder.fpn.p5
    torch.manual_seed(0)
    plain = parse_model({"name": "pvtv2_fpn"}).build(3, 2, 2)  # the default since 2026-12-05
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
    net = parse_model({"name": "pvtv2_fpn"}).build(3, 2, 2).eval()  # the default
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
    with pytest.raises(ValueError, match="2 classes"):
        PVTv2FPN(3, 1)  # one sigmoid channel: logits only


def test_a_dump_from_before_the_codes_network_became_the_default_reads_as_it_ran(tmp_path):
    """``decoder_init`` and ``upsample`` default to FedDP's code since 2026-12-05: a run's
    ``config.yaml`` without them ran smp's ``FPN`` (kaiming, logits), and reads so; a
    hand-written config without them gets the code's network."""
    import yaml

    from fedseg.config import dump_config, load_config, parse_config

    raw = {"data": {"root": "x"}, "model": {"name": "pvtv2_fpn"}}
    new = parse_config(raw)
    assert (new.model["decoder_init"], new.model["upsample"]) == ("torch", "probabilities")
    dumped = yaml.safe_load(dump_config(new))
    del dumped["model"]["decoder_init"], dumped["model"]["upsample"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dumped))
    old = load_config(path, run_dump=True)
    assert (old.model["decoder_init"], old.model["upsample"]) == ("kaiming", "logits")
    assert load_config(path).model == new.model
    path.write_text(dump_config(new))
    assert load_config(path, run_dump=True) == new
