"""PVTv2-b0: timm's parameter count, shapes, gradients, and loading ImageNet checkpoints."""

import math
import re

import pytest
import torch

from fedseg.errors import ConfigError
from fedseg.models.fpn import PVTv2FPN
from fedseg.models.pvtv2 import PVTv2, convert_pvtv2_state_dict
from fedseg.models.registry import parse_model


def test_parameter_count_equals_timm_pvt_v2_b0_without_head():
    enc = PVTv2(3)
    assert sum(p.numel() for p in enc.parameters()) == 3_409_760
    # timm's model with its ImageNet classifier (256 -> 1000) has 3,666,760
    assert 3_409_760 + 256 * 1000 + 1000 == 3_666_760
    queries = {n: p for n, p in enc.named_parameters() if ".attn.q." in n}
    assert len(queries) == 16
    assert sum(p.numel() for p in queries.values()) == 193_536


def test_stage_shapes_at_64_px():
    enc = PVTv2(3).eval()
    feats = enc(torch.randn(2, 3, 64, 64))
    assert [tuple(f.shape) for f in feats] == [
        (2, 32, 16, 16),
        (2, 64, 8, 8),
        (2, 160, 4, 4),
        (2, 256, 2, 2),
    ]


def test_one_input_channel_changes_only_the_first_patch_embedding():
    one = sum(p.numel() for p in PVTv2(1).parameters())
    assert one == 3_409_760 - 2 * 32 * 7 * 7


def test_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    enc = PVTv2(3, drop_path=0.1).train()
    sum(f.square().mean() for f in enc(torch.randn(2, 3, 64, 64))).backward()
    for n, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, n


def test_fpn_runs_its_encoder_through_the_encode_hook():
    """Like the UNet, ``encode`` is where a subclass transforms the encoder features."""

    class Halved(PVTv2FPN):
        def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [f * 0.5 for f in super().encode(x)]

    torch.manual_seed(0)
    plain = PVTv2FPN(1, 2).eval()
    halved = Halved(1, 2).eval()
    halved.load_state_dict(plain.state_dict())
    x = torch.randn(1, 1, 64, 64)
    out, ref = halved.forward_features(x), plain.forward_features(x)
    torch.testing.assert_close(out.features["enc1"], 0.5 * ref.features["enc1"])
    assert not torch.allclose(halved(x), plain(x))


def _timm_named(enc: PVTv2) -> dict[str, torch.Tensor]:
    """A synthetic timm ``pvt_v2_b0`` checkpoint: timm's names, random values, 1000-class head."""
    g = torch.Generator().manual_seed(1)
    sd = {k: torch.randn(v.shape, generator=g) for k, v in enc.state_dict().items()}
    sd["head.weight"] = torch.randn(1000, 256, generator=g)
    sd["head.bias"] = torch.randn(1000, generator=g)
    return sd


def _original_name(key: str) -> str:
    """timm name -> the original whai362/PVT name (hand-written inverse of timm's filter)."""
    key = re.sub(r"^stages\.(\d)\.downsample\.", lambda m: f"patch_embed{int(m[1]) + 1}.", key)
    key = re.sub(r"^stages\.(\d)\.blocks\.", lambda m: f"block{int(m[1]) + 1}.", key)
    key = re.sub(r"^stages\.(\d)\.norm\.", lambda m: f"norm{int(m[1]) + 1}.", key)
    return key.replace("mlp.dwconv.", "mlp.dwconv.dwconv.")


def test_original_names_map_as_documented():
    assert (
        _original_name("stages.0.blocks.1.mlp.dwconv.weight") == "block1.1.mlp.dwconv.dwconv.weight"
    )
    sd = {
        "patch_embed1.proj.weight": torch.zeros(1),
        "block2.0.attn.q.weight": torch.zeros(1),
        "block4.1.mlp.dwconv.dwconv.bias": torch.zeros(1),
        "norm3.weight": torch.zeros(1),
        "head.weight": torch.zeros(1),
    }
    assert sorted(convert_pvtv2_state_dict(sd)) == [
        "stages.0.downsample.proj.weight",
        "stages.1.blocks.0.attn.q.weight",
        "stages.2.norm.weight",
        "stages.3.blocks.1.mlp.dwconv.bias",
    ]


@pytest.mark.parametrize("naming", ["timm", "original", "prefixed"])
def test_checkpoint_loads_into_the_network(naming, tmp_path):
    ref = PVTv2(3)
    sd = _timm_named(ref)
    if naming == "original":
        sd = {_original_name(k): v for k, v in sd.items()}
    elif naming == "prefixed":
        sd = {"state_dict": {f"module.{k}": v for k, v in sd.items()}}
    path = tmp_path / "pvt_v2_b0.pth"
    torch.save(sd, path)
    net = parse_model({"name": "pvtv2_fpn", "weights": str(path)}).build(3, 2, 2)
    assert isinstance(net, PVTv2FPN)
    expected = _timm_named(ref)
    for k, v in net.encoder.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_bad_checkpoints_are_refused_naming_the_field(tmp_path):
    sd = _timm_named(PVTv2(3))
    path = tmp_path / "w.pth"
    torch.save(sd, path)
    with pytest.raises(ConfigError, match=r"model.weights"):  # 1 input channel != ImageNet's 3
        parse_model({"name": "pvtv2_fpn", "weights": str(path)}).build(1, 2, 2)
    torch.save({**sd, "decoder.p5.weight": torch.zeros(1)}, path)
    with pytest.raises(ConfigError, match=r"not PVTv2 encoder keys.*decoder.p5"):
        parse_model({"name": "pvtv2_fpn", "weights": str(path)}).build(3, 2, 2)
    with pytest.raises(ConfigError, match=r"model.weights"):
        parse_model({"name": "pvtv2_fpn", "weights": str(tmp_path / "none.pth")}).build(3, 2, 2)


def test_spatial_reduction_attention_matches_the_formula():
    torch.manual_seed(0)
    blk = PVTv2(3).stages[1].blocks[0].attn  # 64 channels, 2 heads, reduction 4
    h = w = 8
    x = torch.randn(2, h * w, 64)
    grid = blk.sr(x.transpose(1, 2).reshape(2, 64, h, w)).flatten(2).transpose(1, 2)
    src = blk.norm(grid)
    q, k, v = blk.q(x), *blk.kv(src).chunk(2, dim=-1)
    heads = []
    for i in range(2):
        sl = slice(32 * i, 32 * (i + 1))
        a = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(32), dim=-1)
        heads.append(a @ v[..., sl])
    want = blk.proj(torch.cat(heads, dim=-1))
    assert src.shape[1] == (h // 4) * (w // 4)
    assert torch.allclose(blk(x, h, w), want, atol=1e-5)
