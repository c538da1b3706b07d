"""SynergyNet (reconstructed): size, shapes, the quantiser's gradient path, codebook usage
metrics, shared vs private codebook, and 2-round 3D federated runs in-process and over Flower."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from fedseg.config import load_config, parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method
from fedseg.models import UNet, parse_model
from fedseg.models.synergynet import SynergyNet
from fedseg.models.vq import VectorQuantizer, perplexity
from fedseg.testing import toy_federation

TINY = {
    "name": "synergynet",
    "widths": (8, 16, 32),
    "dropout": (0.0, 0.0, 0.0),
    "codebook_size": 16,
    "layers": 2,
    "heads": 2,
    "pos_grid": 4,
}
CONFIGS = sorted((Path(__file__).parents[2] / "configs" / "pancreas3d").glob("*synergynet*.yaml"))


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def bottleneck_params(
    ndim: int,
    c: int,
    k: int,
    d: int | None = None,
    layers: int = 8,
    mlp_ratio: int = 4,
    grid: int = 8,
    block: bool = False,
) -> int:
    """SynergyBlock size: projection (C D + D), codebook (K D), projection back (D C + C,
    only if D != C), residual conv block (2 (k^n C^2 + C) + 4 C for its two BatchNorms),
    positional embedding (C grid^n), branch embedding (2 C), per transformer layer
    ((4 + 2 r) C^2 + (9 + r) C: qkv and output projections, MLP, two LayerNorms), final
    LayerNorm (2 C), fusion conv (2 C^2 + C)."""
    d = d or c
    conv_block = 2 * (3**ndim * c * c + c) + 4 * c if block else 0
    back = d * c + c if d != c else 0
    per_layer = (4 + 2 * mlp_ratio) * c * c + (9 + mlp_ratio) * c
    return (
        c * d + d + k * d + back + conv_block + c * grid**ndim + 2 * c
        + layers * per_layer + 2 * c + 2 * c * c + c
    )  # fmt: skip


@pytest.mark.parametrize(("ndim", "total"), [(2, 8_477_154), (3, 12_122_434)])
def test_default_parameter_count(ndim, total):
    """Default SynergyNet-8s2h: the 1-channel 2-class UNet (2D 1,813,474; 3D 5,344,066) plus
    a 6,663,680 (2D) / 6,778,368 (3D) parameter synergy block (C = D = 256, K = 512)."""
    net = parse_model({"name": "synergynet"}).build(1, 2, ndim)
    unet = _count(UNet(1, 2, ndim))
    assert _count(net) == total
    assert _count(net) - unet == bottleneck_params(ndim, 256, 512)
    assert _count(net.synergy.layers) == 8 * 789_760  # 12 C^2 + 13 C, C = 256


@pytest.mark.parametrize("ndim", [2, 3])
def test_non_default_sizes_follow_the_formula(ndim):
    cfg = {**TINY, "code_dim": 8, "continuous_block": True, "mlp_ratio": 2, "layers": 3}
    net = parse_model(cfg).build(2, 3, ndim)
    unet = UNet(2, 3, ndim, (8, 16, 32), (0.0, 0.0, 0.0))
    expected = bottleneck_params(ndim, 32, 16, d=8, layers=3, mlp_ratio=2, grid=4, block=True)
    assert _count(net) - _count(unet) == expected


@pytest.mark.parametrize(
    ("shape", "grid"),
    [((2, 1, 32, 32), (8, 8)), ((2, 1, 16, 32, 32), (4, 8, 8)), ((1, 1, 12, 20, 24), (3, 5, 6))],
)
def test_output_shapes_and_named_features(shape, grid):
    ndim = len(shape) - 2
    net = parse_model(TINY).build(1, 3, ndim).eval()
    x = torch.randn(shape)
    with torch.no_grad():
        logits = net(x)
        out = net.forward_features(x)
    assert logits.shape == (shape[0], 3, *shape[2:])
    assert torch.allclose(out.logits, logits)
    feats = out.features
    assert list(feats) == ["enc1", "enc2", "enc3", "dec2", "dec1"]
    assert feats["enc3"].shape == (shape[0], 32, *grid)  # the fused bottleneck
    assert feats["dec1"].shape == (shape[0], 8, *shape[2:])


def test_quantiser_straight_through_and_codebook_gradient():
    vq = VectorQuantizer(8, 4, beta=0.25)
    z = torch.randn(2, 4, 3, 5, requires_grad=True)
    out = vq(z)
    flat = z.detach().movedim(1, -1).reshape(-1, 4)
    idx = vq.codes(flat)
    quantised = out.detach().movedim(1, -1).reshape(-1, 4)
    assert torch.allclose(quantised, vq.codebook.weight[idx], atol=1e-6)  # z + (e - z)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    assert torch.equal(z.grad, upstream)  # identity gradient through the quantiser
    assert vq.codebook.weight.grad is None  # the output alone never moves the codebook
    z.grad = None
    loss = vq.pop_auxiliary_loss()
    assert vq.pop_auxiliary_loss() is None
    e = vq.codebook.weight.detach()[idx]
    expected = (1 + 0.25) * ((flat - e) ** 2).mean()  # codebook + beta * commitment terms
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    used = torch.zeros(8, dtype=torch.bool)
    used[idx] = True
    row_grad = vq.codebook.weight.grad.abs().sum(1)
    assert (row_grad[used] > 0).all() and (row_grad[~used] == 0).all()
    assert torch.allclose(z.grad, 0.25 * 2 * (z - out.detach()) / z.numel())


def test_encoder_gets_task_gradient_only_through_the_straight_through_estimator():
    torch.manual_seed(0)
    net = parse_model(TINY).build(1, 2, 3)
    logits = net(torch.randn(2, 1, 8, 16, 16))
    net.synergy.quantizer.pop_auxiliary_loss()  # drop the VQ loss: task gradient only
    logits.square().mean().backward()
    # the projection feeds only the quantiser: its gradient must pass the arg-min via STE
    assert net.synergy.project.weight.grad.abs().sum() > 0
    assert net.synergy.quantizer.codebook.weight.grad is None


def test_no_grad_forwards_record_nothing_and_the_network_deep_copies():
    net = parse_model(TINY).build(1, 2, 2)
    x = torch.randn(2, 1, 16, 16)
    net(x)  # a training forward: its loss waits for train_steps
    assert net.synergy.quantizer.pop_auxiliary_loss() is not None
    with torch.no_grad():
        net(x)
    assert net.synergy.quantizer.pop_auxiliary_loss() is None
    copy.deepcopy(net)  # e.g. MOON's and MetaFed's model copies


def test_perplexity():
    assert perplexity(torch.tensor([5, 0, 0])) == pytest.approx(1.0)
    assert perplexity(torch.tensor([3, 3, 3, 3])) == pytest.approx(4.0)
    assert perplexity(torch.zeros(3)) == 0.0


def _sim(method: str, model: dict, *, rounds: int = 2, ndim: int = 3, wd: float = 1e-4):
    spec, sites = toy_federation(2, n_train=4, size=16, ndim=ndim, labels="full", with_val=True)
    cls = get_method(method)
    train = TrainSettings(rounds=rounds, local_iters=2, batch_size=2, weight_decay=wd)
    return Simulation(cls(cls.Config(), spec, parse_model(model)), sites, train, seed=0)


@pytest.mark.parametrize(("vq_weight", "moves"), [(1.0, True), (0.0, False)])
def test_vq_loss_enters_training_and_moves_the_codebook(vq_weight, moves):
    sim = _sim("local", {**TINY, "vq_weight": vq_weight}, rounds=1, wd=0.0)
    before = sim.model.synergy.quantizer.codebook.weight.detach().clone()
    record = sim.round(0)
    after = sim.states["site0"]["weights"]["synergy.quantizer.codebook.weight"]
    # the STE gives the codebook no task gradient: only the hook's VQ loss can move it
    assert (not torch.equal(before, after)) == moves
    m = record["clients"]["site0"]
    assert 1.0 <= m["vq_perplexity"] <= 16 and 0 <= m["vq_dead_codes"] < 16
    assert m["vq_codes"] == 16 and math.isfinite(m["vq_loss"])


def test_train_steps_of_a_plain_unet_reports_only_the_loss():
    sim = _sim("fedavg", {"name": "unet", "widths": (8, 16), "dropout": (0.0, 0.0)}, rounds=1)
    assert set(sim.round(0)["clients"]["site0"]) == {"loss"}


def test_3d_fedavg_aaw_two_rounds_shared_codebook():
    sim = _sim("fedavg_aaw", TINY)
    records = [sim.round(r) for r in range(2)]
    key = "synergy.quantizer.codebook.weight"
    assert key in sim.template  # shared: uploaded and averaged like any weight
    for rec in records:
        assert set(rec["clients"]) == {"site0", "site1"}
        assert all("vq_perplexity" in m for m in rec["clients"].values())
    assert sum(records[1]["server"]["aaw_weights"].values()) == pytest.approx(1.0)
    res = sim.evaluate({"fg": [1]}, batch_size=2)
    assert all(0 <= r["metrics"]["dsc"]["fg"] <= 1 for r in res.values())


def test_private_codebook_stays_on_each_site():
    sim = _sim("fedavg", {**TINY, "codebook": "private"})
    key = "synergy.quantizer.codebook.weight"
    assert key not in sim.template
    assert sim.params["total"] - sim.params["upload"] == 16 * 32
    for r in range(2):
        sim.round(r)
    books = [s["weights"][key] for s in sim.states.values()]
    assert not torch.equal(books[0], books[1])  # each site trained its own codebook
    shared = sim.payloads["site0"].tensors
    assert key not in shared and "synergy.fuse.weight" in shared
    models = {s: sim.eval_model(s).state_dict()[key].clone() for s in ("site0", "site1")}
    assert all(torch.equal(models[s], sim.states[s]["weights"][key]) for s in models)


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="heads"):
        parse_model({**TINY, "heads": 3})
    with pytest.raises(ConfigError, match=r"model\.codebook"):
        parse_model({**TINY, "codebook": "local"})
    spec, _ = toy_federation(2)
    cls = get_method("fedlppa")
    with pytest.raises(ConfigError, match=r"model\.name"):
        cls(cls.Config(), spec, parse_model(TINY)).build_model()


def test_table2_configs_select_synergynet():
    assert {p.stem for p in CONFIGS} == {
        "local_synergynet",
        "fedavg_synergynet",
        "fedavg_aaw_synergynet",
    }
    for path in CONFIGS:
        cfg = load_config(path)
        assert cfg.model["name"] == "synergynet" and cfg.data.synth.task == "pancreas3d"
        assert isinstance(cfg.model_settings.build(1, 2, 3), SynergyNet)


@pytest.fixture(scope="module")
def pancreas(tmp_path_factory) -> Path:
    from fedseg.data.synth import synthesize

    root = tmp_path_factory.mktemp("pancreas3d")
    synthesize("pancreas3d", root, size=16, per_site=6, split=(0.5, 0.25, 0.25))
    return root


def test_3d_run_over_flower_equals_in_process(pancreas, tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "flower"))
    from flower_helpers import assert_same_metrics, direct_link

    from fedseg.engine.flower.link import run_federation

    cfg = parse_config(
        {
            "name": "synergynet-flower",
            "seed": 3,
            "data": {"root": str(pancreas), "labels": "full", "sites": ["A", "B"]},
            "method": {"name": "fedavg_aaw"},
            "model": TINY,
            "train": {"rounds": 2, "local_iters": 2, "batch_size": 2, "loss": "dice_bce"},
            "eval": {"batch_size": 2},
            "engine": {"device": "cpu"},
        }
    )
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, pancreas, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    assert res["communication"] == ref["communication"]
    for run in ("inproc", "flower"):
        lines = (tmp_path / run / "rounds.jsonl").read_text().splitlines()
        rounds = [json.loads(line) for line in lines]
        clients = [rec["clients"] for rec in rounds if "clients" in rec]
        assert len(clients) == 2
        assert all(
            {"vq_perplexity", "vq_dead_codes"} <= set(m) for c in clients for m in c.values()
        )
