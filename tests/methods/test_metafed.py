import pydantic
import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.fedbn import BN_LAYERS
from fedseg.methods.metafed import MetaFed, labeled_dice, personal_lambda
from fedseg.models import UNet
from fedseg.testing import toy_federation

TRAIN = TrainSettings(rounds=2, local_iters=2, batch_size=4, augment=False)


def _sim(sites: int = 3, train: TrainSettings = TRAIN, **cfg) -> Simulation:
    spec, data = toy_federation(sites, n_train=4, size=16)
    return Simulation(MetaFed(MetaFed.Config(**cfg), spec), data, train, seed=0)


def _spy_uploads(sim: Simulation) -> list[dict]:
    seen: list[dict] = []
    original = sim.method.server_step

    def spy(uploads, state, ctx):
        seen.append({s: dict(u.tensors) for s, u in uploads.items()})
        return original(uploads, state, ctx)

    sim.method.server_step = spy
    return seen


def test_teachers_follow_the_configured_ring_then_the_last_member():
    train = TrainSettings(rounds=3, local_iters=1, batch_size=4, augment=False)
    sim = _sim(train=train, order=(2, 0, 1))  # ring site2 -> site0 -> site1 -> site2
    uploads = _spy_uploads(sim)
    records = [sim.round(r) for r in range(3)]
    assert [r["server"]["phase"] for r in records] == ["common", "personal", "personal"]
    assert all(m["teacher"] == -1.0 for m in records[0]["clients"].values())  # init round
    ring_teacher = {"site0": 2.0, "site1": 0.0, "site2": 1.0}
    assert records[0]["server"]["teachers"] == ring_teacher
    assert {s: m["teacher"] for s, m in records[1]["clients"].items()} == ring_teacher
    # personalization: everyone learns from the last ring member's model of round 1
    assert {s: m["teacher"] for s, m in records[2]["clients"].items()} == dict.fromkeys(
        ring_teacher, 1.0
    )
    assert sim.server_state["common_from"] == 1.0
    for key, value in sim.server_state["common"].items():
        assert torch.equal(value, uploads[1]["site1"][key])


def test_server_forwards_exactly_the_predecessors_upload():
    train = TrainSettings(rounds=3, local_iters=1, batch_size=4, augment=False)
    sim = _sim(train=train)
    uploads = _spy_uploads(sim)
    sim.round(0)
    for site, teacher in (("site0", "site2"), ("site1", "site0"), ("site2", "site1")):
        sent = sim.payloads[site].tensors
        assert set(sent) == set(uploads[0][teacher])
        assert all(torch.equal(sent[k], uploads[0][teacher][k]) for k in sent)


@pytest.mark.parametrize("threshold, copied", [(2.0, True), (-1.0, False)])
def test_unflagged_site_copies_the_teacher_flagged_site_distils(threshold, copied):
    train = TrainSettings(rounds=3, local_iters=2, batch_size=4, augment=False, lr=1e-2)
    sim = _sim(sites=2, train=train, threshold=threshold)
    sim.round(0)  # local training: the two sites now differ
    own = dict(sim.states["site1"]["own"])
    teacher = sim.payloads["site1"].tensors
    sim.train = train.model_copy(update={"lr": 0.0})  # no weight change in round 1
    res = sim.round(1)["clients"]["site1"]
    after = sim.states["site1"]["own"]
    assert res["copied"] == float(copied) and res["flag"] == float(not copied)
    reference = teacher if copied else own
    assert all(torch.equal(after[k], reference[k]) for k in after)
    assert res["lam"] == (0.0 if copied else 1.0)


def test_distillation_gradient_reaches_the_student_only():
    sim = _sim(sites=2)
    ctx = sim.context(sim.sites["site0"], 1)
    torch.manual_seed(1)
    student, teacher = UNet(1, 2).eval(), UNet(1, 2).eval().requires_grad_(False)
    net, loss = sim.method.distillation(student, teacher, ctx, lam=1.0)
    images = torch.randn(2, 1, 16, 16)
    unlabeled = torch.full((2, 16, 16), ctx.spec.ignore_index)  # seg loss is exactly 0
    value = loss(net(images), unlabeled)
    value.backward()
    assert value > 0
    grads = [p.grad for p in student.parameters()]
    assert (
        all(g is not None for g in grads)
        and student.encoder.blocks[0][0].weight.grad.abs().sum() > 0
    )
    assert all(p.grad is None for p in teacher.parameters())
    expected = torch.nn.functional.mse_loss(
        student.forward_features(images).decoder[-1], teacher.forward_features(images).decoder[-1]
    )
    torch.testing.assert_close(value, expected)


def test_personal_lambda():
    assert personal_lambda(0.5, 0.8, lam=2.0, thes=0.5) == pytest.approx(2.0)  # teacher +0.2
    assert personal_lambda(0.7, 0.7, lam=1.0, thes=0.5) == pytest.approx(0.1)
    assert personal_lambda(0.4, 0.4, lam=1.0, thes=0.5) == 0.0
    assert 0 < personal_lambda(0.9, 0.8, lam=1.0, thes=0.5) < 0.1


def test_labeled_dice_uses_labeled_pixels_only():
    spec, _ = toy_federation(1)
    model = lambda x: torch.stack([-x[:, 0], x[:, 0]], 1)  # noqa: E731 - predicts fg where x > 0
    images = torch.tensor([[[[1.0, 1.0], [-1.0, -1.0]]]])
    labels = torch.tensor([[[1, spec.ignore_index], [0, 1]]])
    assert labeled_dice(model, images, labels, spec) == pytest.approx(2 * 1 / (1 + 2))


def test_config_and_schedule_validation():
    with pytest.raises(pydantic.ValidationError, match="permutation"):
        MetaFed.Config(order=(0, 0, 1))
    spec, _ = toy_federation(3)
    with pytest.raises(ConfigError, match="all 3 site"):
        MetaFed(MetaFed.Config(order=(1, 0)), spec)
    with pytest.raises(ConfigError, match="init_rounds"):
        MetaFed(MetaFed.Config(init_rounds=2), spec).phase(0, 2)


def test_two_rounds_bn_stays_local_and_counts_match_table_ix():
    sim = _sim()
    uploads = _spy_uploads(sim)
    records = [sim.round(r) for r in range(2)]
    bn = set(BN_LAYERS(sim.model))
    for site_uploads in uploads:
        for tensors in site_uploads.values():
            assert set(tensors) == set(sim.method.parts(sim.model).upload)
            assert not bn & set(tensors)
    assert sim.params == {"total": 1_813_474, "upload": 1_810_530, "download": 1_810_530}
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in records[-1]["clients"].values())
    ev = sim.evaluate({"fg": [1]})
    assert all(0 <= v["metrics"]["dsc"]["fg"] <= 1 for v in ev.values())
    assert get_method("metafed") is MetaFed
