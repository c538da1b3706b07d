import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.feddp import disagreement, uncertainty_weighted_bce
from fedseg.models.fpn import PVTv2FPN
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=3, local_iters=1, batch_size=4, augment=False)


def _sim(model=None, **cfg) -> Simulation:
    spec, sites = toy_federation(2, labels="full")
    cls = get_method("feddp")
    sim = Simulation(cls(cls.Config(**cfg), spec, model), sites, TRAIN, seed=0)
    sim.uploads = []
    original = sim.method.server_step

    def spy(uploads, state, ctx):
        sim.uploads.append({s: set(u.tensors) for s, u in uploads.items()})
        return original(uploads, state, ctx)

    sim.method.server_step = spy
    return sim


def _queries(sim: Simulation) -> set[str]:
    return {k for k in sim.model.state_dict() if ".attn.q." in k}


def test_queries_never_leave_a_site_without_igc():
    sim = _sim(ft_epochs=0)
    q = _queries(sim)
    assert len(q) == 16 and isinstance(sim.model, PVTv2FPN)
    assert not q & set(sim.template)
    assert not any(k.startswith(("query.", "peer.")) for k in sim.template)
    before = {s: {k: sim.states[s]["weights"][k].clone() for k in q} for s in ("site0", "site1")}
    for r in range(TRAIN.rounds):
        sim.round(r)
        for p in sim.payloads.values():
            assert not q & set(p.tensors) and not any(k.startswith("peer.") for k in p.tensors)
    assert all(not q & keys for up in sim.uploads for keys in up.values())
    own = [sim.states[s]["weights"] for s in ("site0", "site1")]
    assert set(own[0]) == q
    key = "encoder.stages.0.blocks.0.attn.q.weight"
    assert not torch.equal(own[0][key], own[1][key])  # personal queries
    assert not torch.equal(own[0][key], before["site0"][key])  # and trained


def test_igc_exchanges_queries_once_after_the_last_round():
    sim = _sim(ft_epochs=1)
    q = _queries(sim)
    for r in range(TRAIN.rounds):
        sim.round(r)
        extra = {k for keys in sim.uploads[-1].values() for k in keys if k.startswith("query.")}
        peers = {k for k in sim.payloads["site0"].tensors if k.startswith("peer.")}
        if r < TRAIN.rounds - 1:
            assert not extra and not peers
    assert all(not q & keys for up in sim.uploads for keys in up.values())  # never as weights
    assert extra == {f"query.{k}" for k in q}
    assert peers == {f"peer.{i}.{k}" for i in (0, 1) for k in q}
    for i, s in enumerate(("site0", "site1")):
        for k in q:
            assert torch.equal(
                sim.payloads["site0"].tensors[f"peer.{i}.{k}"], sim.states[s]["weights"][k]
            )


def test_igc_fine_tuning_uses_the_ensemble_and_leaves_the_stored_model(monkeypatch):
    sim = _sim(ft_epochs=1)
    for r in range(TRAIN.rounds):
        sim.round(r)
    stored = {k: v.clone() for k, v in sim.states["site1"]["weights"].items()}
    seen = []

    def spy(probs):
        seen.append(probs.shape[0])
        return disagreement(probs)

    monkeypatch.setattr("fedseg.methods.feddp.disagreement", spy)
    tuned = sim.eval_model("site1").state_dict()
    assert seen and set(seen) == {2}  # both sites' stage-1 models
    key = "encoder.stages.0.blocks.0.attn.q.weight"
    assert not torch.equal(tuned[key], stored[key])
    assert all(torch.equal(sim.states["site1"]["weights"][k], v) for k, v in stored.items())


def test_disagreement_and_weighted_bce():
    agree = torch.rand(1, 2, 3, 4, 4).expand(3, -1, -1, -1, -1)
    assert torch.count_nonzero(disagreement(agree)) == 0
    probs = agree.clone()
    probs[0, 1, 2, 3, 3] += 0.5
    u = disagreement(probs)
    assert u.max() == 1.0 and torch.count_nonzero(u) == 1 and u[1, 2, 3, 3] == 1.0
    logits = torch.randn(2, 3, 4, 4)
    labels = torch.randint(0, 3, (2, 4, 4))
    assert uncertainty_weighted_bce(logits, labels, torch.zeros_like(logits), 255) == 0
    full = uncertainty_weighted_bce(logits, labels, torch.ones_like(logits), 255)
    labels[0] = 255
    half = uncertainty_weighted_bce(logits, labels, torch.ones_like(logits), 255)
    ref = torch.nn.functional.binary_cross_entropy(
        logits[1:].softmax(1), torch.nn.functional.one_hot(labels[1:], 3).movedim(-1, 1).float()
    )
    torch.testing.assert_close(half, ref)
    assert full > 0
    # bf16 logits (under autocast): the BCE of probabilities runs in float32 (CUDA's autocast
    # refuses it) and agrees with the float32 loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = uncertainty_weighted_bce(logits.bfloat16(), labels, torch.ones_like(logits), 255)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, half, atol=0.02, rtol=0.02)


def test_backbone_choice_and_bad_query_are_named():
    cls = get_method("feddp")
    spec, _ = toy_federation(2)
    with pytest.raises(ConfigError, match=r"method\.backbone"):
        cls(cls.Config(), spec, {"name": "unet", "widths": [8, 16, 32, 64, 128]})
    unet = cls(cls.Config(backbone="model", query=("decoder.head.*",)), spec)
    parts = unet.parts(unet.build_model())
    assert set(parts.private) == {"decoder.head.weight", "decoder.head.bias"}
    bad = cls(cls.Config(backbone="model"), spec)
    with pytest.raises(ConfigError, match=r"method\.query"):
        bad.parts(bad.build_model())


def test_query_parameter_count_of_pvtv2_b0():
    spec, _ = toy_federation(2, channels=3)
    method = get_method("feddp")(get_method("feddp").Config(), spec)
    parts = method.parts(method.build_model())
    assert parts.count(parts.private) == 193_536 and len(parts.private) == 16
