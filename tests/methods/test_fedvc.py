"""Virtual classes + PAA (fedvc): head geometry, losses, partition, frozen virtual rows,
personal/shared PAA parts, communication."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.base import ServerContext
from fedseg.methods.fedvc import pseudo_labels, virtual_class_loss, virtual_usage
from fedseg.models.fpn import PVTv2FPN
from fedseg.models.paa import PAA
from fedseg.models.unet import UNet
from fedseg.models.vc_head import VirtualClassHead
from fedseg.models.vc_net import PAAUNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False, lr=1e-2)
VIRTUAL = "decoder.head.virtual"


def _method(sites: int = 3, classes: int = 3, model=None, **cfg):
    spec, data = toy_federation(sites, num_classes=classes, labels="full")
    cls = get_method("fedvc")
    return cls(cls.Config(**cfg), spec, model), data


def _gram(rows: torch.Tensor) -> torch.Tensor:
    return rows @ rows.T


def test_head_rows_are_orthonormal_and_virtual_rows_are_a_buffer():
    head = VirtualClassHead(16, 3, 12, scale=10.0)
    rows = torch.cat([head.real, head.virtual])
    assert torch.allclose(_gram(rows), torch.eye(15), atol=1e-5)
    assert "virtual" in dict(head.named_buffers())
    assert [n for n, _ in head.named_parameters()] == ["real"]
    assert isinstance(head.proj, torch.nn.Identity)


def test_more_classes_than_feature_width_get_a_wider_projection():
    head = VirtualClassHead(16, 3, 48, scale=10.0)  # V = 4CN for C=3, N=4
    assert head.width == 51 and head.proj.in_channels == 16 and head.proj.out_channels == 51
    rows = torch.cat([head.real, head.virtual])
    assert torch.allclose(_gram(rows), torch.eye(51), atol=1e-5)
    assert head(torch.randn(2, 16, 8, 8)).shape == (2, 51, 8, 8)


def test_logits_are_scaled_cosine_similarities():
    head = VirtualClassHead(8, 2, 4, scale=7.0)
    z = torch.randn(1, 8, 3, 3)
    rows = torch.cat([head.real, head.virtual]).detach()
    pix = z[0, :, 1, 2]
    want = 7.0 * F.cosine_similarity(pix[None], rows, dim=1)
    assert torch.allclose(head(z)[0, :, 1, 2], want, atol=1e-5)


def test_pseudo_labels_over_all_or_within_the_real_class_block():
    # C = 2, V = 4: class 0 owns virtual rows 0-1, class 1 rows 2-3
    virtual = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.5, 0.1, 0.2, 0.4]]).T.reshape(1, 4, 1, 2)
    labels = torch.tensor([[[1, 0]]])
    assert pseudo_labels(virtual, labels, 2, "all", 255).tolist() == [[[3, 2]]]
    assert pseudo_labels(virtual, labels, 2, "per_class", 255).tolist() == [[[5, 2]]]
    ignored = pseudo_labels(virtual, torch.tensor([[[255, 0]]]), 2, "per_class", 255)
    assert ignored.tolist() == [[[255, 2]]]


def test_virtual_loss_is_eq5_with_real_logits_masked_and_sends_no_gradient_to_them():
    logits = torch.tensor([3.0, -1.0, 0.5, 2.0, -0.5]).reshape(1, 5, 1, 1).requires_grad_()
    labels = torch.zeros(1, 1, 1, dtype=torch.long)
    _, parts = virtual_class_loss(
        logits, labels, num_classes=2, ignore_index=255, pseudo_label="all"
    )
    # masked vector [0, 0, 0.5, 2.0, -0.5], pseudo-label = virtual class with 2.0
    expected = -(2.0 - math.log(2 * math.exp(0) + math.exp(0.5) + math.exp(2.0) + math.exp(-0.5)))
    assert parts["virtual"].item() == pytest.approx(expected, rel=1e-6)
    grads = [
        torch.autograd.grad(
            virtual_class_loss(
                logits, labels, num_classes=2, ignore_index=255, lambda_v=lv, pseudo_label="all"
            )[0],
            logits,
        )[0]
        for lv in (0.0, 1.0)
    ]
    assert torch.equal(grads[0][0, :2], grads[1][0, :2])  # L_v adds nothing to real logits
    assert not torch.equal(grads[0][0, 2:], grads[1][0, 2:])


def test_loss_weights_combine_as_eq8():
    logits = torch.randn(2, 9, 4, 4)
    labels = torch.randint(0, 3, (2, 4, 4))
    total, p = virtual_class_loss(
        logits, labels, num_classes=3, ignore_index=255, lambda_r=0.5, lambda_v=2.0
    )
    assert total.item() == pytest.approx((p["dice"] + 0.5 * p["ce"] + 2 * p["virtual"]).item())
    plain, q = virtual_class_loss(logits[:, :3], labels, num_classes=3, ignore_index=255)
    assert q["virtual"].item() == 0.0
    assert plain.item() == pytest.approx((q["dice"] + q["ce"]).item())


def test_virtual_usage_counts_rows_entropy_and_rows_shared_by_classes():
    # C = 2 classes x V = 4 rows; class 0 spread evenly over rows 0-1, class 1 on row 1 and 3
    counts = torch.tensor([[50, 50, 0, 0], [0, 60, 0, 40]])
    usage = virtual_usage(counts)
    assert usage["vc_rows_c0"] == 2 and usage["vc_rows_c1"] == 2
    assert usage["vc_entropy_c0"] == pytest.approx(1.0)
    h1 = -(0.6 * math.log2(0.6) + 0.4 * math.log2(0.4))
    assert usage["vc_entropy_c1"] == pytest.approx(h1)
    assert usage["vc_shared"] == pytest.approx(50 / 200)  # row 1: 60 of class 1 win, 50 lost
    assert usage["vc_shared_c0"] == pytest.approx(0.5) and usage["vc_shared_c1"] == 0.0
    rare = virtual_usage(torch.tensor([[995, 5, 0, 0], [0, 0, 0, 0]]))
    assert rare["vc_rows_c0"] == 1 and "vc_rows_c1" not in rare  # < 1 %; class absent
    assert rare["vc_shared"] == 0.0 and rare["vc_shared_c0"] == 0.0


def test_loss_counts_labelled_pixels_per_class_and_pseudo_label_row():
    logits = torch.randn(2, 2 + 4, 5, 5)
    labels = torch.randint(0, 2, (2, 5, 5))
    labels[0, 0] = 255  # five unlabelled pixels are not counted
    for mode in ("all", "per_class"):
        counts = torch.zeros(2, 4, dtype=torch.long)
        virtual_class_loss(
            logits, labels, num_classes=2, ignore_index=255, pseudo_label=mode, counts=counts
        )
        target = pseudo_labels(logits[:, 2:], labels, 2, mode, 255)
        keep = labels != 255
        for c in (0, 1):
            want = torch.bincount(target[keep & (labels == c)] - 2, minlength=4)
            assert torch.equal(counts[c], want), mode
        assert counts.sum() == 45
    assert counts[0, 2:].sum() == 0 and counts[1, :2].sum() == 0  # per_class: own block only


@pytest.mark.parametrize("mode", ["per_class", "all"])
def test_rounds_log_virtual_row_usage_per_class(mode):
    method, data = _method(pseudo_label=mode)
    record = Simulation(method, data, TRAIN, seed=0).round(0)
    per_class = method.num_virtual // 3
    for metrics in record["clients"].values():
        for c in range(3):
            assert 1 <= metrics[f"vc_rows_c{c}"] <= (per_class if mode == "per_class" else 9)
            assert 0 <= metrics[f"vc_entropy_c{c}"] <= math.log2(metrics[f"vc_rows_c{c}"]) + 0.1
        assert 0 <= metrics["vc_shared"] <= 1
        if mode == "per_class":
            assert metrics["vc_shared"] == 0.0 and metrics["vc_shared_c1"] == 0.0


def test_default_partition_keeps_virtual_rows_queries_and_modulation_on_the_site():
    method, _ = _method()
    assert method.num_virtual == 3 * 3  # C x N
    model = method.build_model()
    assert isinstance(model, PAAUNet) and len(model.paa) == 4
    template = method.upload_template(model)
    keys = set(model.state_dict())
    assert VIRTUAL in keys and VIRTUAL not in template
    assert "decoder.head.real" in template
    for i in range(4):
        assert f"paa.{i}.key.weight" in template
        assert f"paa.{i}.query.weight" not in template
        assert f"paa.{i}.modulation.weight" not in template
    assert set(method.download_template(model)) == set(template)
    private = set(method.parts(model).private)
    assert private == {VIRTUAL} | {
        f"paa.{i}.{p}.{w}"
        for i in range(4)
        for p in ("query", "modulation")
        for w in ("weight", "bias")
    }


@pytest.mark.parametrize(
    ("cfg", "private"),
    [
        ({"paa_shared": ("query", "key", "modulation")}, {VIRTUAL}),
        ({"paa_shared": ("query",)}, {VIRTUAL, "key", "modulation"}),
        ({"paa": False}, {VIRTUAL}),
        ({"vc": False}, {"query", "modulation"}),
        ({"vc": False, "paa": False}, set()),
    ],
)
def test_ablation_options_change_what_travels(cfg, private):
    method, _ = _method(**cfg)
    model = method.build_model()
    parts = {k if k == VIRTUAL else k.split(".")[2] for k in method.parts(model).private}
    assert parts == private
    if not cfg.get("vc", True):
        assert "decoder.head.weight" in model.state_dict()  # the backbone's conv head
    if cfg.get("paa") is False:
        assert not any(k.startswith("paa.") for k in model.state_dict())


def test_plain_options_give_the_plain_unet():
    method, _ = _method(vc=False, paa=False)
    model = method.build_model()
    ref = UNet(1, 3)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 1, 32, 32)
    assert torch.equal(model.eval()(x), ref.eval()(x))


def test_virtual_count_options_and_errors():
    assert _method(virtual_factor=0.25)[0].num_virtual == 3  # per class: max(1, round(3 / 4))
    assert _method(virtual_factor=0.25, pseudo_label="all")[0].num_virtual == 2  # round(9 / 4)
    assert _method(virtual_factor=4)[0].num_virtual == 36
    assert _method(virtual_factor=0.5, sites=5)[0].num_virtual == 6  # 3 x round(2.5), not 7
    with pytest.raises(ConfigError, match=r"method\.pseudo_label"):
        _method(virtual_classes=5)
    assert _method(virtual_classes=5, pseudo_label="all")[0].num_virtual == 5
    cls = get_method("fedvc")
    with pytest.raises(ValueError, match="not both"):
        cls.Config(virtual_classes=5, virtual_factor=2)
    with pytest.raises(ValueError, match="twice"):
        cls.Config(paa_shared=("key", "key"))


def test_virtual_rows_never_change_and_paa_keys_are_averaged_queries_stay_personal():
    method, data = _method()
    sim = Simulation(method, data, TRAIN, seed=0)
    init = {s: st["weights"][VIRTUAL].clone() for s, st in sim.states.items()}
    first = next(iter(init.values()))
    assert all(torch.equal(v, first) for v in init.values())
    init_real = sim.payloads["site0"].tensors["decoder.head.real"].clone()
    for r in range(TRAIN.rounds):
        sim.round(r)
    for s, st in sim.states.items():
        assert torch.equal(st["weights"][VIRTUAL], first), s  # bit-identical, never updated
    assert torch.allclose(_gram(first), torch.eye(first.shape[0]), atol=1e-5)
    assert not torch.equal(sim.payloads["site0"].tensors["decoder.head.real"], init_real)
    q = [st["weights"]["paa.0.query.weight"] for st in sim.states.values()]
    assert not torch.equal(q[0], q[1]) and not torch.equal(q[1], q[2])  # personal

    # one more round by hand: the server's key is the sample-weighted mean of the uploads
    uploads = {
        s: method.client_step(sim.payloads[s], sim.states[s], sim.context(sim.sites[s], 2)).upload
        for s in sim.sites
    }
    for up in uploads.values():
        assert VIRTUAL not in up.tensors and "paa.1.query.weight" not in up.tensors
        assert "paa.1.modulation.bias" not in up.tensors
    ctx = ServerContext(method.spec, 2, TRAIN, torch.Generator())
    out = method.server_step(uploads, {}, ctx)
    n = {s: u.num_examples for s, u in uploads.items()}
    want = sum(uploads[s].tensors["paa.1.key.weight"] * n[s] for s in n) / sum(n.values())
    for p in out.payloads.values():
        assert torch.allclose(p.tensors["paa.1.key.weight"], want, atol=1e-6)
        assert "paa.1.query.weight" not in p.tensors
    uniform = get_method("fedvc")(get_method("fedvc").Config(average="uniform"), method.spec)
    flat = uniform.server_step(uploads, {}, ctx).payloads["site0"].tensors["paa.1.key.weight"]
    mean = sum(u.tensors["paa.1.key.weight"] for u in uploads.values()) / 3
    assert torch.allclose(flat, mean, atol=1e-6)


def test_communication_is_the_shared_weights_only():
    method, data = _method()
    sim = Simulation(method, data, TRAIN, seed=0)
    record = sim.round(0)
    model = method.build_model()
    sd = model.state_dict()
    shared = method.parts(model).upload
    values = sum(sd[k].numel() for k in shared)
    for site, size in record["comm"]["upload"].items():
        assert size["values"] == values, site
    private = sum(sd[k].numel() for k in method.parts(model).private)
    assert values + private == sum(v.numel() for v in sd.values())
    # versus FedAvg on the same network: nothing extra travels, the personal parts stay home
    fedavg, _ = _method(paa_shared=("query", "key", "modulation"))
    avg_model = fedavg.build_model()
    avg_values = sum(avg_model.state_dict()[k].numel() for k in fedavg.parts(avg_model).upload)
    paa_personal = sum(
        v.numel() for k, v in sd.items() if k.startswith("paa.") and ".key." not in k
    )
    assert avg_values - values == paa_personal


def test_segment_uses_the_real_classes_only():
    method, _ = _method()

    class Fixed(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(x.shape[0], 12, 2, 2)
            out[:, 1] = 1.0
            out[:, 7] = 5.0  # a virtual class wins overall
            return out

    assert method.segment(Fixed(), torch.zeros(1, 1, 2, 2)).unique().tolist() == [1]


def test_pvtv2_fpn_backbone_ours_dagger_trains():
    spec, data = toy_federation(2, num_classes=2, labels="full", size=64)
    cls = get_method("fedvc")
    method = cls(cls.Config(), spec, {"name": "pvtv2_fpn"})
    model = method.build_model()
    assert isinstance(model, PVTv2FPN) and len(model.paa) == 3
    assert model.decoder.head.virtual.shape == (4, 128)  # V = C x N = 4, in the FPN's width
    assert {k.split(".")[2] for k in method.parts(model).private if k != VIRTUAL} == {
        "query",
        "modulation",
    }
    sim = Simulation(method, data, TrainSettings(rounds=1, local_iters=1, batch_size=2), seed=0)
    before = sim.states["site0"]["weights"][VIRTUAL].clone()
    record = sim.round(0)
    assert all(math.isfinite(v) for m in record["clients"].values() for v in m.values())
    assert torch.equal(sim.states["site1"]["weights"][VIRTUAL], before)


def test_pvtv2_fpn_ours_dagger_segments_real_classes_at_the_input_size():
    # The benchmark's size (32 px: the FPN map is 8x8, the deepest level 1x1). Virtual
    # logits win the arg-max over all C + V channels at many pixels; the label map must
    # still come from the C real channels, bilinearly brought back to the input grid.
    spec, _ = toy_federation(2, num_classes=3, labels="full", size=32)
    cls = get_method("fedvc")
    method = cls(cls.Config(), spec, {"name": "pvtv2_fpn"})
    torch.manual_seed(0)
    model = method.build_model().eval()
    x = torch.randn(2, spec.in_channels, 32, 32)
    with torch.no_grad():
        out = model(x)
        labels = method.segment(model, x)
    assert out.shape == (2, 3 + 6, 32, 32)
    assert (out.argmax(1) >= 3).any()
    assert labels.shape == (2, 32, 32) and int(labels.max()) < 3
    assert torch.equal(labels, out[:, :3].argmax(1))


def test_paa_computes_eqs_9_to_12():
    torch.manual_seed(0)
    paa = PAA(4, 6)
    d, e = torch.randn(1, 4, 3, 3), torch.randn(1, 6, 3, 3)

    def conv1x1(layer, x):
        return (
            torch.einsum("oi,bihw->bohw", layer.weight[:, :, 0, 0], x) + layer.bias[:, None, None]
        )

    q, k = conv1x1(paa.query, d), conv1x1(paa.key, e)
    m = conv1x1(paa.modulation, torch.relu(q + k))
    assert torch.allclose(paa(d, e), q * m, atol=1e-6)


def test_paa_unet_changes_the_decoder_and_every_paa_weight_learns():
    torch.manual_seed(0)
    plain, paa = PAAUNet(1, 3, paa=False), PAAUNet(1, 3)
    missing = paa.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing and all(k.startswith("paa.") for k in missing)
    x = torch.randn(2, 1, 32, 32)
    out = paa.eval().forward_features(x)
    assert not torch.allclose(out.logits, plain.eval()(x))
    assert [tuple(f.shape[1:]) for f in out.decoder] == [
        (128, 4, 4),
        (64, 8, 8),
        (32, 16, 16),
        (16, 32, 32),
    ]
    paa.train()
    F.cross_entropy(paa(x), torch.randint(0, 3, (2, 32, 32))).backward()
    for n, p in paa.paa.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_three_dimensional_unet_backbone_runs():
    spec, data = toy_federation(2, num_classes=3, labels="full", ndim=3, size=16)
    cls = get_method("fedvc")
    method = cls(cls.Config(), spec)
    sim = Simulation(method, data, TrainSettings(rounds=1, local_iters=1, batch_size=2), seed=0)
    record = sim.round(0)
    assert all(math.isfinite(v) for m in record["clients"].values() for v in m.values())
    ev = sim.evaluate({"fg": [1, 2]})
    assert all(0.0 <= v["metrics"]["dsc"]["fg"] <= 1.0 for v in ev.values())
