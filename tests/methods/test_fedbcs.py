"""FedBCS: FSR in the encoder, dual-level prototypes, FINCH on the server, L_contra +
L_consis, Table 2 switches and Table 3 prototype counts."""

import math
import warnings

import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.base import FederationSpec, SiteSpec
from fedseg.methods.fedbcs import FedBCSNet, FusedEmbedding, consistency_loss, contrastive_loss
from fedseg.methods.prototypes import class_sums
from fedseg.models.fsr import FSR
from fedseg.models.unet import UNet
from fedseg.testing import toy_federation

pytestmark = pytest.mark.filterwarnings("ignore:.*pynndescent.*")

TRAIN = TrainSettings(rounds=2, local_iters=3, batch_size=4, augment=False)
FedBCS = get_method("fedbcs")


def _spec(n_sites: int, num_classes: int = 2, channels: int = 1) -> FederationSpec:
    sites = tuple(SiteSpec(f"s{i}", i, 10 * (i + 1)) for i in range(n_sites))
    return FederationSpec(channels, num_classes, 2, 255, "full", sites, (32, 32))


def _method(spec: FederationSpec, model: dict | None = None, **cfg) -> object:
    return FedBCS(FedBCS.Config(**cfg), spec, model)


def _fused(maps: dict[str, torch.Tensor]) -> dict[str, FusedEmbedding]:
    """Dense maps ``[B, D, *S]`` as one-level fused embeddings (the deep half zero)."""
    return {
        b: FusedEmbedding(
            (t,), (t.new_zeros(*t.shape[:2], *[1] * (t.dim() - 2)),), tuple(t.shape[2:])
        )
        for b, t in maps.items()
    }


def _run(rounds: int = 2, **cfg) -> tuple[Simulation, list[dict]]:
    spec, sites = toy_federation(3, labels="full")
    method = FedBCS(FedBCS.Config(**cfg), Simulation.method_spec(FedBCS, spec, sites))
    sim = Simulation(method, sites, TRAIN.model_copy(update={"rounds": rounds}), seed=0)
    return sim, [sim.round(r) for r in range(rounds)]


def test_dual_level_embeddings_on_harmofl_unet():
    method = _method(_spec(2, channels=3), {"name": "harmofl_unet"})
    net = method.build_model()
    assert isinstance(net, FedBCSNet)
    # FSR after enc2, enc3, enc4 (64/128/256 channels), not after enc1 or the bottleneck
    post = net.backbone.encoder.post
    assert sorted(post) == ["enc2", "enc3", "enc4"]
    assert [m.gamma.numel() for m in post.values()] == [64, 128, 256]
    # fusion: shallow level + deepest level -> 256 channels (code: 288/320/384 -> 256)
    assert [c.in_channels for c in net.fusion["enc"]] == [288, 320, 384]
    assert [c.in_channels for c in net.fusion["dec"]] == [384, 320, 288]
    logits, emb = net.embed(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 2, 32, 32)
    assert emb["enc"].shape == (2, 768, 32, 32)  # full resolution
    assert emb["dec"].shape == (2, 768, 8, 8)  # dec3's resolution, H/4


def test_fusion_equals_the_concatenated_form_of_eqs_10_11():
    """The fusion runs the deep map's half of each 1x1 convolution at the deep resolution;
    it must equal conv(cat(shallow, nearest-upsampled deep)) as the paper writes it."""
    import torch.nn.functional as F

    from fedseg.methods.fedbcs import _fuse

    net = _method(_spec(2, channels=3), {"name": "harmofl_unet"}).build_model()
    out = net.backbone.forward_features(torch.randn(2, 3, 32, 32))
    enc = out.encoder[:-1]
    shallow, deep, convs = enc[:-1], enc[-1], net.fusion["enc"]
    literal = [
        conv(torch.cat([s, F.interpolate(deep, size=s.shape[2:], mode="nearest")], 1))
        for s, conv in zip(shallow, convs, strict=True)
    ]
    size = literal[0].shape[2:]
    want = torch.cat([F.interpolate(f, size=size, mode="nearest") for f in literal], 1)
    torch.testing.assert_close(_fuse(shallow, deep, convs).dense(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", [32, 48])
def test_fused_rows_and_class_sums_equal_the_dense_map(side):
    """The losses read the fused embedding at the pixels they use and its class sums, never
    the dense map: the rows must be the dense map's pixels (the same additions, so exactly),
    with the same gradients, and the class sums the dense map's up to summation order."""
    torch.manual_seed(0)
    net = _method(_spec(3, num_classes=3, channels=3), {"name": "harmofl_unet"}).build_model()
    _, emb = net.embed(torch.randn(2, 3, side, side))
    labels = torch.randint(0, 3, (2, side, side))
    labels[0, :4] = 255  # ignored pixels count nowhere
    for b, fused in emb.items():
        dense = fused.dense()
        assert dense.shape == fused.shape
        n = math.prod(fused.size)
        index = torch.randperm(2 * n, generator=torch.Generator().manual_seed(1))[:300]
        rows = fused.rows(index)
        assert torch.equal(rows, dense.flatten(2)[index // n, :, index % n]), b
        weights = torch.randn_like(rows)
        params = [p for p in net.fusion[b].parameters()]
        got = torch.autograd.grad((rows * weights).sum(), params, retain_graph=True)
        want = torch.autograd.grad(
            (dense.flatten(2)[index // n, :, index % n] * weights).sum(), params, retain_graph=True
        )
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        sums, counts = fused.class_sums(labels, 3)
        want_sums, want_counts = class_sums(dense.detach(), labels, 3)
        assert torch.equal(counts, want_counts)
        torch.testing.assert_close(sums, want_sums, rtol=1e-4, atol=1e-3)


def test_finch_in_the_server_step_merges_near_and_separates_far_prototypes():
    spec = _spec(5)
    method = _method(spec, branches=["enc"])
    model = method.build_model()
    dim = model.embed_dim
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
    fg = [u, u, v, v, v]  # sites 0-1 look alike, sites 2-4 look alike
    uploads = {}
    for i, s in enumerate(spec.site_names):
        protos = torch.stack([torch.zeros(dim), fg[i] + 0.01 * torch.randn(dim, generator=gen)])
        counts = torch.tensor([0 if i else 3, 5])  # only site 0 saw the background
        if i == 0:
            protos[0] = torch.ones(dim)
        weights = {k: v * (i + 1) for k, v in model.state_dict().items()}
        uploads[s] = Payload(
            {**weights, "protos.enc": protos, "protos.enc.count": counts},
            num_examples=spec.sites[i].num_train,
        )
    out = method.server_step(uploads, {}, ServerContext(spec, 0, TRAIN, gen))
    payload = out.payloads["s0"]
    cents, cls = payload.tensors["centres.enc"], payload.tensors["centres.enc.class"]
    assert out.metrics["clusters"] == {"enc": [1, 2]}
    assert cls.tolist() == [0, 1, 1]
    torch.testing.assert_close(cents[0], torch.ones(dim))  # a single prototype is kept
    fg_up = torch.stack([uploads[s].tensors["protos.enc"][1] for s in spec.site_names])
    near_u = int(torch.cosine_similarity(cents[1:], u[None]).argmax()) + 1
    torch.testing.assert_close(cents[near_u], fg_up[:2].mean(0))  # sites 0-1 merged
    torch.testing.assert_close(cents[3 - near_u], fg_up[2:].mean(0))  # sites 2-4 merged
    # weights are averaged by sample count (supplement Eq. 27); the same payload for all
    assert all(p is payload for p in out.payloads.values())
    key = "backbone.decoder.head.weight"
    total = sum(s.num_train for s in spec.sites)
    expected = sum(s.num_train / total * uploads[s.name].tensors[key] for s in spec.sites)
    torch.testing.assert_close(payload.tensors[key], expected)
    uniform = _method(spec, branches=["enc"], aggregation="uniform").server_step(
        uploads, {}, ServerContext(spec, 0, TRAIN, gen)
    )
    plain = sum(uploads[s].tensors[key] for s in spec.site_names) / len(uploads)
    torch.testing.assert_close(uniform.payloads["s0"].tensors[key], plain)
    assert not torch.allclose(plain, expected)


def test_contrastive_loss_is_lower_when_features_align_with_their_own_class_centre():
    gen = torch.Generator().manual_seed(1)
    centres = torch.randn(3, 16, generator=gen)
    positive = torch.tensor([False, True, True])  # one background and two foreground centres
    noise = 0.1 * torch.randn(8, 16, generator=gen)
    own, other = centres[1] + noise, centres[0] + noise
    for tau, clamp in [(0.4, False), (0.4, True), (0.005, True), (0.005, False)]:
        assert contrastive_loss(own, centres, positive, tau, clamp) < contrastive_loss(
            other, centres, positive, tau, clamp
        )
    # without caps the loss is the exact InfoNCE; with tau = 0.4 the caps never bind
    exact = contrastive_loss(own, centres, positive, 0.4, clamp=False)
    torch.testing.assert_close(contrastive_loss(own, centres, positive, 0.4, clamp=True), exact)
    sim = (
        torch.nn.functional.normalize(own, dim=1) @ torch.nn.functional.normalize(centres, dim=1).T
    )
    ref = -torch.log(sim[:, 1:].div(0.4).exp().sum(1) / sim.div(0.4).exp().sum(1)).mean()
    torch.testing.assert_close(exact, ref)
    # consistency: zero at the mean of the class's centres, positive elsewhere
    mean = centres[1:].mean(0).expand(4, 16)
    assert consistency_loss(mean, centres[1:]) == 0
    # the code's MSE averages the squared difference over the 16 dimensions; Eq. 16 sums it
    assert consistency_loss(mean + 1, centres[1:]) == pytest.approx(1.0)
    assert consistency_loss(mean + 1, centres[1:], "sum") == pytest.approx(16.0)


@pytest.mark.parametrize("tau", [0.005, 0.8])
def test_contrastive_loss_has_a_gradient_at_small_and_large_tau(tau):
    # post-ReLU-like features and centres: every cosine is far above 0.069, where the
    # authors' caps saturate at tau = 0.005
    gen = torch.Generator().manual_seed(0)
    centres = torch.rand(4, 32, generator=gen)
    positive = torch.tensor([False, False, True, True])
    feats = torch.rand(10, 32, generator=gen).requires_grad_()
    unit = torch.nn.functional.normalize
    assert (unit(feats, dim=1) @ unit(centres, dim=1).T).min() > 0.5
    (grad,) = torch.autograd.grad(contrastive_loss(feats, centres, positive, tau), feats)
    assert grad.norm() > 1e-3 and torch.isfinite(grad).all()
    clamped = contrastive_loss(feats, centres, positive, tau, clamp=True)
    (grad_clamped,) = torch.autograd.grad(clamped, feats)
    if tau == 0.005:  # every exponential on its 1e6 cap: the constant log(M / M_pos)
        assert grad_clamped.norm() == 0
        assert float(clamped.detach()) == pytest.approx(math.log(2.0), abs=1e-6)
    else:
        torch.testing.assert_close(grad_clamped, grad)


def test_default_l_contra_trains_at_the_nuclei_temperature():
    spec, sites = toy_federation(2, labels="full")
    method = FedBCS(FedBCS.Config(tau=0.005), Simulation.method_spec(FedBCS, spec, sites))
    ctx = Simulation(method, sites, TRAIN, seed=0).context(sites["site0"], 0)
    labels = torch.zeros(2, 8, 8, dtype=torch.long)
    labels[:, 2:5, 2:5] = 1
    gen = torch.Generator().manual_seed(0)
    emb = {b: torch.rand(2, 6, 8, 8, generator=gen).requires_grad_() for b in ("enc", "dec")}
    cents = {b: (torch.rand(3, 6, generator=gen), torch.tensor([0, 1, 1])) for b in emb}
    contra, consis = method.mp_terms(_fused(emb), labels, cents, ctx)
    grads = torch.autograd.grad(contra, list(emb.values()))
    assert all(g.norm() > 0 for g in grads)
    # L_consis: the code's MSE averaged over the two branches; Eq. 16 (consis_form: sum)
    # sums the squared distances over the 6 dimensions and over the branches
    per_branch = []
    for b, f in emb.items():
        fg = f.detach().movedim(1, -1)[labels == 1]
        per_branch.append(consistency_loss(fg, cents[b][0][1:], "sum"))
    torch.testing.assert_close(consis, sum(per_branch) / 6 / 2)
    eq16 = FedBCS(FedBCS.Config(tau=0.005, consis_form="sum"), method.spec)
    torch.testing.assert_close(eq16.mp_terms(_fused(emb), labels, cents, ctx)[1], sum(per_branch))


def test_gap_gate_pre_activations_are_order_one_at_any_resolution():
    from fedseg.models.fsr import spectrum_mean

    # GAP of Eq. 4's amplitude |FFT(z)| / HW over the whole spectrum, from the half spectrum
    z = torch.randn(2, 3, 12, 10)
    half = torch.fft.rfftn(z, dim=(2, 3)).abs()
    full = torch.fft.fftn(z, dim=(2, 3), norm="forward").abs().mean((2, 3))
    torch.testing.assert_close(spectrum_mean(half, (12, 10)), full)
    odd = torch.randn(2, 3, 9, 7)
    torch.testing.assert_close(
        spectrum_mean(torch.fft.rfftn(odd, dim=(2, 3)).abs(), (9, 7)),
        torch.fft.fftn(odd, dim=(2, 3), norm="forward").abs().mean((2, 3)),
    )
    torch.manual_seed(0)
    net = _method(_spec(2), {"name": "harmofl_unet"}, fsr_gate="gap", cdpa=False).build_model()
    pre: dict[int, dict[str, torch.Tensor]] = {}
    size = [0]
    for k, m in net.encoder.post.items():
        m.gate_fc.register_forward_hook(
            lambda _m, _i, out, k=k: pre.setdefault(size[0], {}).__setitem__(k, out.detach())
        )
    base = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    for size[0] in (32, 192):
        with torch.no_grad():
            net(torch.nn.functional.interpolate(base, size=size[0], mode="bilinear"))
    for k in net.encoder.post:
        assert pre[32][k].abs().max() < 1 and pre[192][k].abs().max() < 1
        assert (pre[32][k] - pre[192][k]).abs().max() < 0.2


def test_prototype_loss_pulls_foreground_pixels_only_and_vanishes_without_centres():
    spec, sites = toy_federation(2, labels="full")
    method = FedBCS(FedBCS.Config(tau=0.4), Simulation.method_spec(FedBCS, spec, sites))
    sim = Simulation(method, sites, TRAIN, seed=0)
    ctx = sim.context(sites["site0"], 0)
    labels = torch.zeros(2, 8, 8, dtype=torch.long)
    labels[:, 2:5, 2:5] = 1
    emb = {"enc": torch.randn(2, 4, 8, 8)}
    cents = (torch.randn(3, 4), torch.tensor([0, 1, 1]))
    none = (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert all(t == 0 for t in method.mp_terms(_fused(emb), labels, {"enc": none}, ctx))
    contra, consis = method.mp_terms(_fused(emb), labels, {"enc": cents}, ctx)
    assert contra > 0 and consis > 0
    moved = {"enc": emb["enc"].clone()}
    moved["enc"][:, :, 6:, 6:] += 5.0  # background pixels only
    assert torch.equal(
        torch.stack(method.mp_terms(_fused(moved), labels, {"enc": cents}, ctx)),
        torch.stack([contra, consis]),
    )
    every = FedBCS(FedBCS.Config(tau=0.4, pull="all"), method.spec)
    assert every.mp_terms(_fused(moved), labels, {"enc": cents}, ctx)[1] != consis
    # max_pixels: a cap above the 18 foreground pixels changes nothing, a binding one does
    loose = FedBCS(FedBCS.Config(tau=0.4, max_pixels=18), method.spec)
    torch.testing.assert_close(
        torch.stack(loose.mp_terms(_fused(emb), labels, {"enc": cents}, ctx)),
        torch.stack([contra, consis]),
    )
    tight = FedBCS(FedBCS.Config(tau=0.4, max_pixels=3), method.spec)
    assert tight.mp_terms(_fused(emb), labels, {"enc": cents}, ctx)[1] != consis


def test_table3_prototype_counts_and_communication():
    sim, records = _run()
    dim = sim.model.embed_dim
    k = 2
    state = sim.model.state_dict()
    weight_values = sum(t.numel() for t in state.values())
    for r, rec in enumerate(records):
        # 2 classes x 2 branches (encoder, decoder) = 4 prototypes per client (Table 3)
        assert {m["prototypes"] for m in rec["clients"].values()} == {4.0}
        assert rec["server"]["clusters"] == {"enc": [1, 1], "dec": [1, 1]}  # 3 sites: 1 each
        for site, up in rec["comm"]["upload"].items():
            assert up["values"] == weight_values + 2 * (k * dim + k), site
        # round 1 sends no centres; round 2 sends 1 centre per class and branch
        centres = 0 if r == 0 else 2 * 2 * (dim + 1)
        assert {d["values"] for d in rec["comm"]["download"].values()} == {weight_values + centres}
    assert records[0]["clients"]["site0"]["l_contra"] == 0
    assert all(m["l_contra"] > 0 and m["l_consis"] > 0 for m in records[1]["clients"].values())
    assert sim.params["upload"] == sum(p.numel() for p in sim.model.parameters())
    one, one_branch = _run(rounds=1, branches=["enc"])
    assert {m["prototypes"] for m in one_branch[0]["clients"].values()} == {2.0}
    assert list(one.model.fusion) == ["enc"]  # no decoder fusion weights travel
    dec_fusion = sum(p.numel() for p in sim.model.fusion["dec"].parameters())
    assert one.params["upload"] == sim.params["upload"] - dec_fusion


def test_table2_switches_disable_the_right_parts():
    spec = _spec(2)
    full = _method(spec).build_model()
    assert isinstance(full, FedBCSNet)
    assert sorted(full.backbone.encoder.post) == ["enc2", "enc3", "enc4"]
    cdpa_only = _method(spec, fsr=False).build_model()
    assert isinstance(cdpa_only, FedBCSNet) and not cdpa_only.backbone.encoder.post
    assert not any(isinstance(m, FSR) for m in cdpa_only.modules())
    fsr_only_method = _method(spec, cdpa=False)
    fsr_only = fsr_only_method.build_model()
    assert type(fsr_only) is UNet and sum(isinstance(m, FSR) for m in fsr_only.modules()) == 3
    template = fsr_only_method.upload_template(fsr_only)
    assert not any(k.startswith("protos") for k in template)
    assert not any(k.startswith("centres") for k in fsr_only_method.download_template(fsr_only))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        neither = _method(spec, fsr=False, cdpa=False).build_model()
    assert set(neither.state_dict()) == set(UNet(1, 2).state_dict())  # FedAvg's network
    # FSR only trains and uploads weights alone; CDPA only exchanges prototypes without FSR
    sim, records = _run(cdpa=False)
    assert all("prototypes" not in m for m in records[1]["clients"].values())
    assert "clusters" not in records[1]["server"]
    sim, records = _run(rounds=1, fsr=False)
    assert {m["prototypes"] for m in records[0]["clients"].values()} == {4.0}
    assert not any(isinstance(m, FSR) for m in sim.model.modules())


def test_bad_settings_name_the_field():
    spec = _spec(2)
    with pytest.raises(ConfigError, match="fsr_levels"):
        _method(spec, fsr_levels=[6]).build_model()
    with pytest.raises(ValueError, match="branches"):
        FedBCS.Config(branches=["enc", "enc"])
    with pytest.raises(ValueError, match="tau"):
        FedBCS.Config(tau=0)


def test_full_run_is_finite_and_repeatable():
    _, first = _run()
    _, again = _run()
    losses = [m["loss"] for m in first[1]["clients"].values()]
    assert all(math.isfinite(v) for v in losses)
    assert losses == [m["loss"] for m in again[1]["clients"].values()]


def test_cdpa_prototype_is_the_fusion_of_per_level_prototypes():
    # F is a 1x1 convolution (affine per pixel), so the class mean of the fused embedding
    # equals F applied to the concatenated class means of the levels over the same pixels:
    # the per-layer prototypes of Eqs. 9-11, each level's map taken at enc1's resolution
    from fedseg.methods.prototypes import class_sums

    torch.manual_seed(0)
    net = _method(_spec(2), fsr=False, branches=["enc"]).build_model().eval()  # no dropout
    x = torch.randn(2, 1, 32, 32)
    labels = torch.zeros(2, 32, 32, dtype=torch.long)
    labels[:, 5:20, 8:25] = 1
    with torch.no_grad():
        _, emb = net.embed(x)
        enc = net.backbone.forward_features(x).encoder[:-1]
        sums, counts = class_sums(emb["enc"].dense(), labels, 2)
        fused = sums / counts[:, None]
        up = [torch.nn.functional.interpolate(m, size=(32, 32), mode="nearest") for m in enc]
        per_level = []
        for k, conv in enumerate(net.fusion["enc"]):
            s, n = class_sums(torch.cat([up[k], up[-1]], 1), labels, 2)
            means = (s / n[:, None])[:, :, None, None]
            per_level.append(conv(means)[:, :, 0, 0])
    torch.testing.assert_close(fused, torch.cat(per_level, 1), rtol=1e-4, atol=1e-5)
