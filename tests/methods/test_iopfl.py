import pytest
import torch
import torch.nn.functional as F

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError, UploadError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.iopfl import RoutedConv, _apply, _transform
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _sim(num_sites: int = 2, **cfg) -> Simulation:
    spec, sites = toy_federation(num_sites, labels="full")
    cls = get_method("iopfl")
    sim = Simulation(cls(cls.Config(**cfg), spec), sites, TRAIN, seed=0)
    sim.uploads = []
    original = sim.method.server_step

    def spy(uploads, state, ctx):
        sim.uploads.append({s: dict(u.tensors) for s, u in uploads.items()})
        return original(uploads, state, ctx)

    sim.method.server_step = spy
    return sim


def test_inside_trajectory_is_kept_by_the_site_and_used_for_its_evaluation():
    sim = _sim(alpha=0.25)
    sim.round(0)
    for s in ("site0", "site1"):  # first trajectory = first local model
        traj = sim.states[s]["traj"]
        assert all(torch.equal(traj[k], v) for k, v in sim.uploads[0][s].items())
    first = {
        s: {k: v.clone() for k, v in sim.states[s]["traj"].items()} for s in ("site0", "site1")
    }
    sim.round(1)
    key = "encoder.blocks.0.0.weight"
    for s in ("site0", "site1"):
        traj, local = sim.states[s]["traj"], sim.uploads[1][s]
        torch.testing.assert_close(
            traj[key], 0.25 * first[s][key] + 0.75 * local[key], rtol=0, atol=0
        )
        # the server follows the same trajectories from the uploads (no extra traffic)
        assert all(torch.equal(sim.server_state["traj"][s][k], v) for k, v in traj.items())
    glob = sim.payloads["site0"].tensors
    avg = weighted_average(
        {
            s: Payload(u, num_examples=n)
            for (s, u), n in zip(sim.uploads[1].items(), (8, 10), strict=True)
        }
    )
    assert all(torch.equal(glob[k], v) for k, v in avg.items())
    ev = sim.eval_model("site1").state_dict()
    assert all(torch.equal(ev[k], v) for k, v in sim.states["site1"]["traj"].items())
    assert not torch.equal(ev[key], glob[key])  # personalised, not the global model


def test_unseen_site_never_contributes_and_adapts_by_routing():
    sim = _sim(3, unseen=("site2",), tta_epochs=2)
    for r in range(TRAIN.rounds):
        sim.round(r)
        assert sim.uploads[-1]["site2"] == {}
    assert "traj" not in sim.states["site2"]
    seen = {
        s: Payload(sim.uploads[-1][s], num_examples=n) for s, n in (("site0", 8), ("site1", 10))
    }
    glob = sim.payloads["site0"].tensors
    assert all(torch.equal(glob[k], v) for k, v in weighted_average(seen).items())
    outside = sim.payloads["site2"].tensors
    assert not any(k.startswith("expert.") for k in glob)
    for i, s in enumerate(("site0", "site1")):
        for k, v in sim.states[s]["traj"].items():
            assert torch.equal(outside[f"expert.{i}.{k}"], v)
    routed = sim.eval_model("site2")
    convs = [m for m in routed.modules() if isinstance(m, RoutedConv)]
    assert len(convs) == sum(1 for m in sim.model.modules() if isinstance(m, torch.nn.Conv2d))
    first = routed.get_submodule("encoder.blocks.0.0")
    key = "encoder.blocks.0.0.weight"
    experts = [outside[f"expert.0.{key}"], outside[f"expert.1.{key}"], outside[key]]
    assert torch.equal(first.kernels, torch.stack(experts))  # kernels are never adapted
    fresh = _sim(3, unseen=("site2",), tta_epochs=0)
    for r in range(TRAIN.rounds):
        fresh.round(r)
    plain = fresh.eval_model("site2")  # no adaptation: the global model
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in glob.items())
    bn = routed.get_submodule("encoder.blocks.0.1")
    assert bn.running_mean is None and not torch.equal(bn.weight, glob["encoder.blocks.0.1.weight"])


def test_routed_conv_mixes_expert_kernels_per_sample():
    torch.manual_seed(0)
    experts = [torch.nn.Conv2d(3, 4, 3, padding=1) for _ in range(3)]
    conv = RoutedConv(torch.nn.Conv2d(3, 4, 3, padding=1), experts, dropout=0.0)
    x = torch.randn(2, 3, 8, 8)
    r = conv.routing(x)
    assert r.shape == (2, 3) and ((r > 0) & (r < 1)).all()
    want = torch.cat(
        [
            F.conv2d(
                x[i : i + 1],
                sum(r[i, e] * experts[e].weight for e in range(3)),
                sum(r[i, e] * experts[e].bias for e in range(3)),
                padding=1,
            )
            for i in range(2)
        ]
    )
    torch.testing.assert_close(conv(x), want)


def test_transforms_are_inverted_exactly():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 2, 8, 8)
    rots, flips = _transform(x, gen)
    assert torch.equal(_apply(_apply(x, rots, flips, False), rots, flips, True), x)
    wide = torch.randn(4, 1, 4, 6)
    rots, flips = _transform(wide, gen)
    assert set(rots) <= {0, 2}
    assert torch.equal(_apply(_apply(wide, rots, flips, False), rots, flips, True), wide)


def test_bad_settings_and_incomplete_uploads_are_refused():
    spec, _ = toy_federation(2)
    cls = get_method("iopfl")
    wrong = cls(cls.Config(unseen=("nowhere",)), spec)
    with pytest.raises(ConfigError, match=r"method\.unseen: unknown sites \['nowhere'\]"):
        wrong.init_server(wrong.build_model())
    with pytest.raises(ConfigError, match="at least one site"):
        cls(cls.Config(unseen=("site0", "site1")), spec)
    sim = _sim(3, unseen=("site2",))
    up = {s: Payload(dict(sim.payloads[s].tensors), num_examples=8) for s in ("site0", "site1")}
    up["site1"] = Payload({}, num_examples=10)
    ctx = ServerContext(sim.method.spec, 0, TRAIN, torch.Generator())
    with pytest.raises(UploadError, match="whole model"):
        sim.method.server_step(up, {}, ctx)
