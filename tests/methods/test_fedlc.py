import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.fedlc import PEER, FedLC, contrast_loss, peer_heads
from fedseg.models.fedlc_net import ChannelSelection, FedLCNet, disagreement_peaks
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
HEAD = {"decoder.head.weight", "decoder.head.bias"}


def _sim(sites: int = 2, train: TrainSettings = TRAIN, **cfg) -> Simulation:
    spec, data = toy_federation(sites, n_train=4, size=16)
    cfg.setdefault("personal_iters", 1)
    return Simulation(FedLC(FedLC.Config(**cfg), spec), data, train, seed=0)


def _count(model: torch.nn.Module, prefix: str = "") -> int:
    return sum(p.numel() for k, p in model.named_parameters() if k.startswith(prefix))


def test_parameter_counts_for_five_sites():
    spec, _ = toy_federation(5, n_train=1, n_test=1)
    method = FedLC(FedLC.Config(), spec)
    model = method.build_model()
    assert _count(model) == 1_893_732  # UNet 1,813,474 + PCS 79,104 + HC 1,154
    assert (_count(model, "pcs."), _count(model, "hc.")) == (79_104, 1_154)
    assert method.parts(model).params() == {
        "total": 1_893_732,
        "upload": 1_813_474,
        "download": 1_813_474,
    }
    shared = FedLC(FedLC.Config(pcs_shared=True), spec)
    assert shared.parts(model).params()["upload"] == 1_813_474 + 79_104


def test_channel_selection_is_a_registered_trained_private_submodule():
    sim = _sim()
    model = sim.model
    assert isinstance(model.pcs, ChannelSelection)
    pcs = {k for k, _ in model.named_parameters() if k.startswith("pcs.")}
    assert pcs and all(p.requires_grad for k, p in model.named_parameters() if k in pcs)
    assert pcs <= set(sim.method.parts(model).private)
    before = {k: v.clone() for k, v in sim.states["site0"]["weights"].items()}
    res = sim.method.client_step(
        sim.payloads["site0"], sim.states["site0"], sim.context(sim.sites["site0"], 0)
    )
    assert all(not torch.equal(res.state["weights"][k], before[k]) for k in pcs)  # trained
    assert not {k for k in res.upload.tensors if k.startswith(("pcs.", "hc."))}
    assert set(res.upload.tensors) == set(sim.method.upload_template(model))
    assert set(res.upload.tensors) >= HEAD


def test_server_averages_the_body_but_returns_each_site_its_own_head():
    sim = _sim()
    keys = list(sim.payloads["site0"].tensors)
    body = [k for k in keys if not k.startswith(("decoder.head.", PEER))]
    uploads = {
        s: Payload(
            {k: torch.full_like(sim.payloads[s].tensors[k], v) for k in body + sorted(HEAD)},
            num_examples=n,
        )
        for s, v, n in (("site0", 1.0, 1), ("site1", 2.0, 2))
    }
    ctx = ServerContext(sim.method.spec, 0, sim.train, torch.Generator())
    out = sim.method.server_step(uploads, sim.server_state, ctx)
    for site, value in (("site0", 1.0), ("site1", 2.0)):
        t = out.payloads[site].tensors
        assert torch.allclose(t[body[0]], torch.full_like(t[body[0]], 5 / 3))
        assert torch.all(t["decoder.head.weight"] == value)
        for i, peer in enumerate((1.0, 2.0)):
            assert torch.all(t[f"{PEER}.{i}.weight"] == peer)
            assert torch.all(t[f"{PEER}.{i}.bias"] == peer)


def test_contrast_loss_pushes_own_attention_away_from_the_others():
    torch.manual_seed(0)
    pcs = ChannelSelection(32, num_sites=3)
    x = torch.randn(2, 32, 4, 4)
    own = pcs.attention(x, 1)
    value = contrast_loss(pcs, own, x, 1)
    expected = -sum(torch.mean((own - pcs.attention(x, j)) ** 2) for j in (0, 2)) / 2
    torch.testing.assert_close(value, expected)
    value.backward()
    assert pcs.embed[0].weight.grad[:, 1].abs().sum() > 0  # the site's own embedding learns
    assert pcs.embed[0].weight.grad[:, [0, 2]].abs().sum() == 0  # the others are references
    single = ChannelSelection(32, num_sites=1)
    assert contrast_loss(single, single.attention(x, 0), x, 0).item() == 0.0


def test_disagreement_peaks_mark_where_heads_disagree_most():
    probs = torch.full((3, 1, 2, 9, 9), 0.5)
    assert disagreement_peaks(probs, 0, kernel=3).sum() == 0  # full agreement
    probs[2, 0, :, 4, 6] = torch.tensor([0.1, 0.9])
    probs[2, 0, :, 1, 1] = torch.tensor([0.4, 0.6])  # smaller disagreement, far away
    peaks = disagreement_peaks(probs, 0, kernel=3, threshold=0.2)
    assert peaks[0, 0, 4, 6] == 1 and peaks[0, 0, 1, 1] == 1 and peaks.sum() == 4  # both classes
    assert disagreement_peaks(probs, 0, kernel=3, threshold=0.5)[0, :, 1, 1].sum() == 0


def test_eval_model_calibrates_with_every_sites_head_and_own_embedding():
    sim = _sim(sites=3)
    records = [sim.round(r) for r in range(2)]
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in records[-1]["clients"].values())
    ctx = sim.context(sim.sites["site2"], 2)
    net = sim.method.eval_model(sim.payloads["site2"], sim.states["site2"], ctx)
    assert isinstance(net, FedLCNet) and net.site == 2 and net.calibrate
    assert len(net.peer_heads) == 3
    meta = peer_heads(sim.payloads["site2"], 3, torch.device("meta"))  # moved to the device
    assert all(w.device.type == b.device.type == "meta" for w, b in meta)
    torch.testing.assert_close(net.peer_heads[2][0], net.decoder.head.weight)  # own head
    x = sim.sites["site2"].test_images[:2]
    net.eval()
    out = net.run(x, 2)
    torch.testing.assert_close(net(x), net.calibrated(out, 2, net.peer_heads))
    ev = sim.evaluate({"fg": [1]})
    assert all(0 <= v["metrics"]["dsc"]["fg"] <= 1 for v in ev.values())


def test_round_splits_its_steps_into_personal_only_then_everything():
    def split(train: TrainSettings, **cfg) -> list[tuple[int, int]]:
        sim = _sim(train=train, **cfg)
        return [sim.method.phase_steps(sim.context(s, 0)) for s in sim.sites.values()]

    assert split(TRAIN) == [(1, 1)] * 2
    assert split(TRAIN, personal_iters=5) == [(2, 0)] * 2  # a short round: personal only
    ten = TrainSettings(local_iters=10, batch_size=4)
    assert split(ten, personal_iters=None) == [(2, 8)] * 2  # personal_fraction 0.2
    epochs = TrainSettings(local_epochs=3, batch_size=4)  # sites of 4 and 6 images
    assert split(epochs, personal_iters=None) == [(1, 2), (1, 5)]
    assert split(epochs, personal_iters=None, personal_fraction=0.5) == [(2, 1), (3, 3)]
    with pytest.raises(ValueError, match="not both"):
        FedLC.Config(personal_iters=1, personal_fraction=0.5)
    assert get_method("fedlc") is FedLC


@pytest.mark.parametrize(("personal", "body_moves"), [(2, False), (0, True)])
def test_personal_phase_leaves_the_shared_body_untouched(personal, body_moves):
    sim = _sim(personal_iters=personal)
    site = sim.sites["site0"]
    before = {k: v.clone() for k, v in sim.payloads["site0"].tensors.items()}
    res = sim.method.client_step(sim.payloads["site0"], sim.states["site0"], sim.context(site, 0))
    body = [k for k in res.upload.tensors if k.endswith("weight") and k not in HEAD]
    moved = [not torch.equal(res.upload.tensors[k], before[k]) for k in body]
    assert all(moved) if body_moves else not any(moved)
    assert not torch.equal(res.upload.tensors["decoder.head.weight"], before["decoder.head.weight"])
