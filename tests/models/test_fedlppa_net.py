import pytest
import torch
import torch.nn.functional as F

from fedseg.methods import FederationSpec, SiteSpec, get_method
from fedseg.models.fedlppa_net import DualLogits, FedLPPANet, bottleneck_shape
from fedseg.models.tdf import TDF, ChannelAttention, SpatialAttention, asp_planes, prompt_affinity


def _faz_spec(size: int = 256, sites: int = 5) -> FederationSpec:
    specs = tuple(SiteSpec(f"s{i}", i, 10, "point", "sparse") for i in range(sites))
    return FederationSpec(1, 2, 2, 255, "weak", specs, image_size=(size, size))


def _params(**config):
    cls = get_method("fedlppa")
    method = cls(cls.Config(**config), _faz_spec())
    model = method.build_model()
    return model, method.parts(model).params()


def test_paper_parameter_counts_faz_config():
    cls = get_method("fedlppa")
    model = cls(cls.Config(), _faz_spec()).build_model()
    params = cls.partition.resolve(model).params()
    assert params == {"total": 2_897_430, "upload": 2_256_228, "download": 2_897_430}
    assert sum(p.numel() for p in model.aux_decoder.parameters()) == 641_202
    sizes = {n: sum(p.numel() for p in m.parameters()) for n, m in model.named_children()}
    assert sizes == {
        "encoder": 1_180_464,
        "tdf": 374_976 + 7_282 + 1_280 + 256,
        "mlp": 50_768,
        "decoder": 641_202,
        "aux_decoder": 641_202,
    }


def test_without_tdf_pd_la_it_is_the_plain_unet():
    _, params = _params(tdf=False, pd=False, la=False)
    assert params == {"total": 1_813_474, "upload": 1_813_474, "download": 1_813_474}


def test_prompt_and_fusion_ablations_change_only_their_parts():
    _, full = _params()
    _, no_asp_ukp = _params(prompts=("ddp",))
    # the first fusion conv loses 4 input planes (UKP + 3 ASP) and the UKP itself goes
    assert full["total"] - no_asp_ukp["total"] == 4 * 128 * 9 + 256
    _, none = _params(fusion="none")
    assert full["total"] - none["total"] == 7_282
    _, channel = _params(fusion="channel")
    assert channel["total"] - none["total"] == 1


def test_forward_modes_and_3d():
    net = FedLPPANet(1, 3, image_size=(32, 32), num_sites=2)
    x = torch.randn(2, 1, 32, 32)
    out = net.train()(x)
    assert isinstance(out, DualLogits) and out.main.shape == out.aux.shape == (2, 3, 32, 32)
    assert net.eval()(x).shape == (2, 3, 32, 32)
    net3 = FedLPPANet(1, 2, image_size=(16, 16, 16), num_sites=2, ndim=3).train()
    assert net3(torch.randn(2, 1, 16, 16, 16)).aux.shape == (2, 2, 16, 16, 16)
    with pytest.raises(ValueError, match="image size"):
        net.eval()(torch.randn(1, 1, 64, 64))


def test_site_selects_ddp_slot_and_asp_which_is_not_state():
    torch.manual_seed(0)
    net = FedLPPANet(1, 2, image_size=(32, 32), num_sites=3).eval()
    assert "tdf.asp" not in net.state_dict()
    x = torch.randn(1, 1, 32, 32)
    outs = []
    for site, sparsity in [(0, "sparse"), (1, "sparse"), (1, "dense"), (1, None)]:
        net.set_site(site, sparsity)
        outs.append(net(x))
    assert all(not torch.allclose(a, b) for i, a in enumerate(outs) for b in outs[i + 1 :])
    assert torch.equal(asp_planes("medium"), torch.tensor([0.0, 1.0, 0.0]))
    assert torch.equal(asp_planes(None), torch.zeros(3))
    with pytest.raises(ValueError):
        net.set_site(3, None)
    with pytest.raises(ValueError):
        asp_planes("box")


def test_attention_gammas_start_at_zero_and_eq5():
    torch.manual_seed(0)
    tdf = TDF(2, 8, (4, 4), 2, fusion="dual").eval()
    assert tdf.spatial.gamma.item() == tdf.channel.gamma.item() == 0.0
    feat = torch.randn(2, 8, 4, 4)
    fused = tdf.fuse(torch.cat([feat, _prompt(tdf, 2)], 1))
    torch.testing.assert_close(tdf(feat), 2 * fused)  # (0 F_s + F^) + (0 F_c + F^)
    with torch.no_grad():
        tdf.spatial.gamma.fill_(0.5)
        tdf.channel.gamma.fill_(2.0)
    expect = 0.5 * tdf.spatial.enhanced(fused) + 2.0 * tdf.channel.enhanced(fused) + 2 * fused
    torch.testing.assert_close(tdf(feat), expect)
    none = TDF(2, 8, (4, 4), 2, fusion="none").eval()
    assert none.spatial is None and none.channel is None


def _prompt(tdf: TDF, b: int) -> torch.Tensor:
    planes = torch.cat([tdf.ddp[:1], tdf.ukp, tdf.asp.view(3, 1, 1).expand(3, 4, 4)])
    return planes.unsqueeze(0).expand(b, -1, -1, -1)


def test_attention_formulas():
    torch.manual_seed(0)
    x = torch.randn(1, 4, 3, 3)
    flat = x.flatten(2)[0]  # [C, HW]
    c = torch.softmax(flat @ flat.T, dim=-1)  # c[j, i]
    torch.testing.assert_close(ChannelAttention().enhanced(x)[0].flatten(1), c @ flat)
    sa = SpatialAttention(2, 4).eval()
    q, k, v = (m(x).flatten(2)[0] for m in (sa.query, sa.key, sa.value))
    s = torch.softmax(k.T @ q, dim=-1)  # s[j, i] = softmax_i(Q_i . K_j)
    assert torch.allclose(s.sum(-1), torch.ones(9))
    torch.testing.assert_close(sa.enhanced(x)[0].flatten(1), v @ s.T)


def test_prompt_affinity_is_relu_cosine():
    ddp = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -0.5]]).view(3, 1, 2)
    ukp = torch.tensor([[0.5, 0.5]]).view(1, 1, 2)
    a = prompt_affinity(ddp, ukp)
    v = torch.cat([ukp.flatten().expand(3, 2), ddp.flatten(1)], 1)
    cos = F.cosine_similarity(v.unsqueeze(1), v.unsqueeze(0), dim=-1)
    torch.testing.assert_close(a, cos.clamp(min=0))
    assert (cos < 0).any() and (a >= 0).all()
    torch.testing.assert_close(torch.diag(a), torch.ones(3))
    torch.testing.assert_close(prompt_affinity(ddp, None)[0, 1], torch.tensor(0.0))


def test_bottleneck_shape():
    assert bottleneck_shape((256, 256)) == (16, 16)
    assert bottleneck_shape((64, 40)) == (4, 2)
    with pytest.raises(ValueError):
        bottleneck_shape((8, 8))
