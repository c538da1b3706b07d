import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, fedcontrast, get_method
from fedseg.methods.clustered_prototypes import kmeans, prototype_infonce
from fedseg.methods.fedcontrast import allocate_prototypes
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)
DIM = 16  # channels of the default UNet's dec1


def _sim(name: str = "fedcontrast", sites: int = 3, **cfg) -> Simulation:
    spec, data = toy_federation(sites, labels="full")
    cls = get_method(name)
    return Simulation(cls(cls.Config(**cfg), spec), data, TRAIN, seed=5)


def test_nine_prototypes_per_class_split_and_validation():
    assert allocate_prototypes(9, 2) == [4, 5]
    assert allocate_prototypes(9, 3) == [3, 3, 3]
    assert allocate_prototypes(10, 3) == [3, 4, 3]
    with pytest.raises(ConfigError, match=r"method\.prototypes"):
        allocate_prototypes(1, 2)
    spec, _ = toy_federation(2)
    cls = get_method("fedcontrast")
    with pytest.raises(ConfigError, match=r"method\.per_class"):
        cls(cls.Config(per_class=(2, 3, 4)), spec)
    assert cls(cls.Config(per_class=(2, 7)), spec).proto_classes.tolist() == [0] * 2 + [1] * 7


def test_every_site_uploads_nine_prototypes_and_gets_the_others():
    sim = _sim()
    weights = sum(t.numel() for t in sim.model.state_dict().values())
    assert sim.template["protos"].shape == (9, DIM)
    for r in range(2):
        record = sim.round(r)
        assert record["failures"] == {}
        assert record["server"]["prototypes"] == {"site0": 9, "site1": 9, "site2": 9}
        for site, size in record["comm"]["upload"].items():
            assert size["values"] == weights + 9 * DIM + 9  # Table 3: 9 prototypes per client
            assert record["clients"][site]["prototypes"] == 9.0
    # each site receives the 2 x 9 prototypes of the other sites, with their classes
    peers = sim.payloads["site1"].tensors
    assert peers["peers"].shape == (18, DIM)
    assert peers["peers.label"].tolist() == ([0] * 4 + [1] * 5) * 2
    # the first 9 peers of site1 are site0's own prototypes (kept privately for the intra term)
    own = sim.states["site0"]
    assert torch.equal(peers["peers"][:9], own["own"])
    assert own["own.count"].gt(0).all()
    # the prototype loss was active in round 2 only
    assert record["clients"]["site0"]["proto_loss"] > 0


def test_zero_weight_is_fedavg():
    a, b = _sim(sites=2, weight=0.0), _sim("fedavg", sites=2)
    for r in range(2):
        la, lb = a.round(r)["clients"], b.round(r)["clients"]
        assert {s: v["loss"] for s, v in la.items()} == pytest.approx(
            {s: v["loss"] for s, v in lb.items()}, rel=1e-6
        )
    # FedAvg's streaming float64 average and the float32 average of the alignment methods
    # differ in the last bits; AdamW turns that noise into lr-sized steps of the conv biases
    # in front of BatchNorm (their gradient is ~0), hence the loose absolute tolerance
    wa, wb = a.payloads["site0"].tensors, b.payloads["site0"].tensors
    for k in wb:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-3)


def test_contrastive_loss_pulls_to_same_class_prototypes_and_pushes_from_others():
    gen = torch.Generator().manual_seed(6)
    protos = torch.randn(3, 8, generator=gen)
    proto_cls = torch.tensor([1, 1, 0])
    f = torch.randn(5, 8, generator=gen, requires_grad=True)
    y = torch.ones(5, dtype=torch.long)
    loss = prototype_infonce(f, y, protos, proto_cls, tau=0.5)
    cos = torch.nn.functional.normalize(f, dim=1) @ torch.nn.functional.normalize(protos, dim=1).T
    e = (cos / 0.5).exp()
    expected = -(e[:, :2].sum(1) / e.sum(1)).log().mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    with torch.no_grad():
        g = f - 0.5 * f.grad
        new = (
            torch.nn.functional.normalize(g, dim=1) @ torch.nn.functional.normalize(protos, dim=1).T
        )
        assert (new[:, :2].sum(1) > cos[:, :2].sum(1)).all()  # closer to class-1 prototypes
        assert (new[:, 2] < cos[:, 2]).all()  # further from the class-0 prototype
        assert prototype_infonce(g, y, protos, proto_cls, 0.5) < loss
    # pixels of a class without prototypes contribute nothing
    none = prototype_infonce(f, torch.full((5,), 2), protos, proto_cls, 0.5)
    assert none.item() == 0.0


def test_kmeans_finds_separated_groups_and_handles_few_points():
    gen = torch.Generator().manual_seed(7)
    centres = torch.tensor([[5.0, 0.0], [-5.0, 0.0], [0.0, 5.0]])
    points = torch.cat([c + 0.1 * torch.randn(20, 2, generator=gen) for c in centres])
    found, counts = kmeans(points, 3, torch.Generator().manual_seed(0))
    assert sorted(counts.tolist()) == [20, 20, 20]
    order = torch.cdist(centres, found).argmin(1)
    torch.testing.assert_close(found[order], points.view(3, 20, 2).mean(1), atol=1e-5, rtol=0)
    few, n = kmeans(points[:2], 5, torch.Generator().manual_seed(0))
    assert few.shape == (2, 2) and n.tolist() == [1, 1]


def test_prototype_loss_weighs_every_class_equally():
    """The nuclei collapse (docs/methods/fedcontrast.md): a pixel mean lets ~93 % background
    pixels decide the loss; the class-balanced loss is the mean of the per-class means."""
    gen = torch.Generator().manual_seed(3)
    protos = torch.randn(5, 8, generator=gen)
    proto_cls = torch.tensor([0, 0, 1, 1, 1])
    f = torch.randn(13, 8, generator=gen)
    y = torch.tensor([0] * 12 + [1])  # 12:1, as background to nuclei at 32 px
    per_class = [prototype_infonce(f[y == c], y[y == c], protos, proto_cls, 0.1) for c in (0, 1)]
    balanced = prototype_infonce(f, y, protos, proto_cls, 0.1)
    torch.testing.assert_close(balanced, (per_class[0] + per_class[1]) / 2)
    pixel_mean = prototype_infonce(f, y, protos, proto_cls, 0.1, balance="pixels")
    torch.testing.assert_close(pixel_mean, (12 * per_class[0] + per_class[1]) / 13)
    # a class without prototypes is left out; nothing to contrast gives 0 on the graph
    only_bg = prototype_infonce(f, y, protos[:2], proto_cls[:2], 0.1)
    torch.testing.assert_close(
        only_bg, prototype_infonce(f[y == 0], y[y == 0], protos[:2], proto_cls[:2], 0.1)
    )
    g = f.clone().requires_grad_(True)
    zero = prototype_infonce(g, torch.full((13,), 2), protos, proto_cls, 0.1)
    zero.backward()
    assert zero.item() == 0.0 and g.grad is not None


@pytest.mark.parametrize("balance", ["classes", "pixels"])
def test_local_training_loss_is_class_balanced_by_default(monkeypatch, balance):
    calls: list[str] = []
    inner = fedcontrast.prototype_infonce

    def spy(*args):
        calls.append(args[-1])
        return inner(*args)

    monkeypatch.setattr(fedcontrast, "prototype_infonce", spy)
    sim = _sim(sites=2, **({} if balance == "classes" else {"balance": balance}))
    sim.round(0)
    assert calls == []  # round 1: no prototypes yet
    record = sim.round(1)
    assert record["clients"]["site0"]["proto_loss"] > 0
    # the intra and the inter term of every step, reduced as configured
    assert set(calls) == {balance} and len(calls) >= 4
