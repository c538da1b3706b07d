import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.alignment import train_with_terms
from fedseg.methods.clustered_prototypes import FeatureView
from fedseg.methods.fedproto import prototype_mse
from fedseg.methods.prototypes import PrototypeAccumulator, class_sums, prototype_tensors
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
DIM = 16  # dec1 of the toy UNet


def _sim(num_sites: int = 2, train: TrainSettings = TRAIN, **cfg) -> Simulation:
    spec, sites = toy_federation(num_sites, labels="full")
    cls = get_method("fedproto")
    return Simulation(cls(cls.Config(**cfg), spec), sites, train, seed=2)


def test_regulariser_is_mse_to_the_class_prototype_and_pulls_features_there():
    gen = torch.Generator().manual_seed(0)
    protos = torch.randn(3, 4, generator=gen)
    counts = torch.tensor([5, 7, 0])  # class 2 has no global prototype
    classes = torch.tensor([0, 1, 1, 2])
    f = torch.randn(4, 4, generator=gen, requires_grad=True)
    value = prototype_mse(f, classes, protos, counts)
    # rows of classes 0 and 1 against their prototypes; class 2's row adds 0 but counts
    rows = (f[:3] - protos[classes[:3]]).pow(2).mean(1)
    torch.testing.assert_close(value, (rows[0] + (rows[1] + rows[2]) / 2 + 0) / 3)
    # balance: pixels is the reference code's MSE over N x D
    pixels = prototype_mse(f, classes, protos, counts, "pixels")
    torch.testing.assert_close(pixels, (f[:3] - protos[classes[:3]]).pow(2).sum() / (4 * 4))
    value.backward()
    assert torch.equal(f.grad[3], torch.zeros(4))
    step = f.detach() - 1.0 * f.grad
    before = (f.detach()[:3] - protos[classes[:3]]).norm(dim=1)
    after = (step[:3] - protos[classes[:3]]).norm(dim=1)
    assert (after < before).all()


def test_server_averages_prototypes_over_the_sites_holding_a_class():
    sim = _sim(3)
    weights = sim.method.weights(sim.payloads["site0"].tensors)
    protos = [torch.full((2, DIM), float(i)) for i in range(3)]
    counts = [torch.tensor([100, 10]), torch.tensor([50, 0]), torch.tensor([50, 30])]
    uploads = {
        f"site{i}": Payload(
            {k: v + i for k, v in weights.items()} | prototype_tensors("protos", p, n),
            num_examples=1 + i,
        )
        for i, (p, n) in enumerate(zip(protos, counts, strict=True))
    }
    ctx = ServerContext(sim.method.spec, 0, TRAIN, torch.Generator())
    out = sim.method.server_step(uploads, {}, ctx).payloads["site0"].tensors
    torch.testing.assert_close(out["protos"][0], torch.full((DIM,), 1.0))  # (0 + 1 + 2) / 3
    torch.testing.assert_close(out["protos"][1], torch.full((DIM,), 1.0))  # (0 + 2) / 2
    assert out["protos.count"].tolist() == [3, 2]  # sites holding each class
    key = next(k for k, v in weights.items() if v.is_floating_point())
    torch.testing.assert_close(out[key], weights[key] + (0 * 1 + 1 * 2 + 2 * 3) / 6)
    # the paper's pixel-count-weighted mean as an option
    pix = get_method("fedproto")(
        get_method("fedproto").Config(prototype_average="pixels"), sim.method.spec
    )
    out = pix.server_step(uploads, {}, ctx).payloads["site0"].tensors
    torch.testing.assert_close(out["protos"][0], torch.full((DIM,), (0 * 100 + 50 + 100) / 200))
    torch.testing.assert_close(out["protos"][1], torch.full((DIM,), (0 * 10 + 2 * 30) / 40))


def test_prototypes_come_from_one_last_epoch_of_training_batches():
    # 3 steps over a site of 8 samples in batches of 8: only the last step's batch counts
    sim = _sim(2, TrainSettings(rounds=1, local_iters=3, batch_size=8, augment=False))
    site = sim.sites["site0"]
    ctx = sim.context(site, 0)
    sim.method.load(ctx.model, Payload(sim.method.weights(sim.payloads["site0"].tensors)), {})
    acc = PrototypeAccumulator(2)
    train_with_terms(FeatureView(ctx.model, "dec1"), ctx, lambda *_: {}, acc)
    _, counts = acc.result()
    _, expected = class_sums(torch.zeros(8, 1, 32, 32), site.train_labels, 2)
    assert torch.equal(counts, expected)


def test_prototypes_and_weights_travel_and_are_counted():
    sim = _sim()
    record = sim.round(0)
    n_weights = sum(v.numel() for v in sim.model.state_dict().values())
    for site in ("site0", "site1"):
        assert record["comm"]["upload"][site]["values"] == n_weights + 2 * DIM + 2
        assert record["comm"]["download"][site]["values"] == n_weights + 2 * DIM + 2
        assert record["clients"][site]["prototypes"] == 2.0  # Table 3: 2 per client
        assert record["clients"][site]["proto_mse"] == 0.0  # no global prototype yet
    glob = sim.payloads["site0"].tensors
    assert glob["protos.count"].tolist() == [2, 2] and glob["protos"].abs().sum() > 0
    second = sim.round(1)
    assert all(m["proto_mse"] > 0 for m in second["clients"].values())


def test_prototypes_only_leaves_weights_unaveraged():
    sim = _sim(prototypes_only=True)
    assert set(sim.template) == {"protos", "protos.count"}
    assert sim.params["upload"] == sim.params["download"] == 0
    record = sim.round(0)
    assert all(v["values"] == 2 * DIM + 2 for v in record["comm"]["upload"].values())
    assert set(sim.payloads["site0"].tensors) == {"protos", "protos.count"}
    own = [sim.states[s]["weights"] for s in ("site0", "site1")]
    assert set(own[0]) == set(sim.model.state_dict())
    # each site keeps (and is evaluated with) its own weights: they differ from each other
    assert any(not torch.equal(own[0][k], own[1][k]) for k in own[0])
    for s in ("site0", "site1"):
        model_sd = sim.eval_model(s).state_dict()
        assert all(
            torch.equal(model_sd[k], sim.states[s]["weights"][k].to(model_sd[k])) for k in own[0]
        )


def test_unknown_feature_level_names_the_field():
    spec, _ = toy_federation(2)
    cls = get_method("fedproto")
    method = cls(cls.Config(level="dec9"), spec)
    with pytest.raises(ConfigError, match=r"method\.level 'dec9'"):
        method.upload_template(method.build_model())


@pytest.mark.parametrize("bad", [{"weight": -1.0}, {"prototype_average": "median"}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        get_method("fedproto").Config(**bad)


def test_class_sums_keep_double_precision_and_sum_bf16_in_float32():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (2, 4, 4), generator=g)
    labels[0, 0, 0] = 255  # ignored
    sums, counts = class_sums(feats, labels, 3)
    flat, y = feats.permute(0, 2, 3, 1).reshape(-1, 3), labels.flatten()
    expected = torch.stack([flat[y == k].sum(0) for k in range(3)])
    assert sums.dtype == torch.float64 and torch.equal(counts, torch.bincount(y[y < 3]))
    torch.testing.assert_close(sums, expected, rtol=0, atol=1e-12)
    low, _ = class_sums(feats.bfloat16(), labels, 3)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, expected.float(), rtol=0.02, atol=0.05)
