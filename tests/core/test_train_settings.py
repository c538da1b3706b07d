"""Training settings: every bad value refused with one line naming the field; the options
the papers use (epochs, momentum, kept optimiser state, Dice loss, cosine schedule) work."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import parse_config
from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError
from fedseg.methods import TrainSettings, get_method
from fedseg.methods.training import segmentation_loss, train_steps
from fedseg.testing import toy_federation

BAD = [
    ({"train": {"rounds": 0}}, "train.rounds"),
    ({"train": {"local_iters": -1}}, "train.local_iters"),
    ({"train": {"local_epochs": 0}}, "train.local_epochs"),
    ({"train": {"batch_size": -4}}, "train.batch_size"),
    ({"train": {"batch_size": 0}}, "train.batch_size"),
    ({"train": {"lr": 0}}, "train.lr"),
    ({"train": {"lr": float("nan")}}, "train.lr"),
    ({"train": {"momentum": 1.5}}, "train.momentum"),
    ({"train": {"weight_decay": -1}}, "train.weight_decay"),
    ({"train": {"optimizer": "adamx"}}, "train.optimizer"),
    ({"train": {"lr_schedule": "cos"}}, "train.lr_schedule"),
    ({"train": {"loss": "focal"}}, "train.loss"),
    ({"train": {"grad_clamp": 0}}, "train.grad_clamp"),
    ({"train": {"grad_clamp": 1.0}, "privacy": {"mode": "local"}}, "train.grad_clamp: not with"),
    ({"train": {"local_iters": 3, "local_epochs": 1}}, "train: set local_iters or local_epochs"),
    ({"eval": {"batch_size": 0}}, "eval.batch_size"),
    ({"eval": {"every": -1}}, "eval.every"),
    ({"engine": {"device": "gpu"}}, "engine.device"),
    ({"model": {"name": "vit"}}, "model: name: unknown model 'vit'"),
    ({"model": {"norm": "bn"}}, "model: norm"),
    ({"model": {"widths": [8, 16]}}, "model: widths and dropout need the same length"),
]


@pytest.mark.parametrize("patch, field", BAD, ids=[f for _, f in BAD])
def test_bad_setting_is_refused_naming_the_field(patch, field, tmp_path: Path):
    raw = {"data": {"root": str(tmp_path)}, **patch}
    with pytest.raises(ConfigError, match=f"run.yaml: {field}".replace(".", r"\.")):
        parse_config(raw, "run.yaml")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "r")])
    assert out.exit_code == 2 and field.split(":")[0] in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) <= 2


def _sim(method: str = "fedavg", **train) -> Simulation:
    spec, sites = toy_federation(2)  # 8 and 10 training images
    cls = get_method(method)
    if "local_epochs" not in train:
        train.setdefault("local_iters", 2)
    settings = TrainSettings(**{"rounds": 2, "batch_size": 4, "augment": False, **train})
    return Simulation(cls(cls.Config(), spec), sites, settings, seed=0)


def test_local_epochs_make_unequal_sites_take_unequal_steps():
    sim = _sim(local_epochs=2)
    steps = {n: sim.context(d, 0).steps() for n, d in sim.sites.items()}
    assert steps == {"site0": 2 * 2, "site1": 2 * 3}  # ceil(8/4), ceil(10/4)
    seen = []
    ctx = sim.context(sim.sites["site1"], 0)
    for _ in range(3):  # one pass: batches of 4, 4, 2 covering every sample once
        images, _ = next(ctx.batches)
        seen.append(len(images))
    assert seen == [4, 4, 2]


def test_ordered_pass_is_the_stored_data_without_augmentation():
    sim = _sim(augment=True)
    data = sim.sites["site0"]
    batches = list(sim.context(data, 0).ordered_batches(3))
    assert [len(x) for x, _ in batches] == [3, 3, 2]
    assert torch.equal(torch.cat([x for x, _ in batches]), data.train_images)
    assert torch.equal(torch.cat([y for _, y in batches]), data.train_labels)


def test_sgd_momentum_and_kept_optimizer_state():
    fresh, kept = (
        _sim(optimizer="sgd", momentum=0.5),
        _sim(optimizer="sgd", momentum=0.5, keep_optimizer_state=True),
    )
    for sim in (fresh, kept):
        sim.round(0)
    state = kept.link.workers["site0"].store.saved[1]["optimizer"]
    assert set(state) == {n for n, _ in kept.model.named_parameters()}
    assert all("momentum_buffer" in v for v in state.values())
    assert fresh.link.workers["site0"].store.saved[1]["optimizer"] == {}
    # round 1 starts from the kept momentum: a different model than a fresh optimiser gives
    for sim in (fresh, kept):
        sim.round(1)
    key = "encoder.blocks.0.0.weight"
    assert not torch.equal(
        fresh.payloads["site0"].tensors[key], kept.payloads["site0"].tensors[key]
    )


def test_kept_optimizer_state_survives_crash_and_resume(tmp_path: Path):
    from fedseg.data.synth import synthesize
    from fedseg.engine.runner import InProcessRunner

    root = tmp_path / "fed"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    raw = {
        "seed": 1,
        "data": {"root": str(root)},
        "train": {"rounds": 3, "local_iters": 2, "batch_size": 4, "optimizer": "adam",
                  "keep_optimizer_state": True},
    }  # fmt: skip
    cfg = parse_config(raw)
    full = InProcessRunner(cfg, tmp_path / "full").run()

    class Crash(Exception):
        pass

    def crash(record: dict) -> None:
        if record["round"] == 1:
            raise Crash

    with pytest.raises(Crash):
        InProcessRunner(cfg, tmp_path / "crashed").run(on_round=crash)
    resumed = InProcessRunner(cfg, tmp_path / "crashed").run(resume=True)
    assert resumed["sites"] == full["sites"]


def test_cosine_schedule_and_dice_loss():
    sim = _sim(lr_schedule="cosine", lr=0.1, loss="dice", rounds=4)
    lrs = [sim.context(sim.sites["site0"], r).lr() for r in range(4)]
    assert lrs == pytest.approx([0.1 * 0.5 * (1 + math.cos(math.pi * r / 4)) for r in range(4)])
    ctx = sim.context(sim.sites["site0"], 0)
    loss = segmentation_loss(ctx)
    logits = torch.randn(2, 2, 8, 8)
    labels = torch.randint(0, 2, (2, 8, 8))
    perfect = torch.nn.functional.one_hot(labels, 2).permute(0, 3, 1, 2).float() * 50
    assert 0 < float(loss(logits, labels)) < 1 and float(loss(perfect, labels)) < 1e-3
    assert train_steps(sim.model, ctx, iters=1)["loss"] > 0


def test_an_epoch_based_run_resumes_from_its_own_config_yaml(tmp_path: Path):
    """The dump of a ``local_epochs`` config parses again (it used to hold the inactive
    ``local_iters`` too, which the validator refuses), so ``--resume``, ``predict`` and the
    reuse of finished runs work for such runs; dumps written before the fix are still read."""
    from fedseg.config import dump_config, load_config
    from fedseg.data.synth import synthesize
    from fedseg.engine.runner import InProcessRunner
    from fedseg.reproduce.harness import finished_run

    root = tmp_path / "fed"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    raw = {
        "seed": 1,
        "data": {"root": str(root)},
        "train": {"rounds": 3, "local_epochs": 1, "batch_size": 4},
    }
    cfg = parse_config(raw)
    assert "local_iters" not in yaml.safe_load(dump_config(cfg))["train"]
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg

    class Crash(Exception):
        pass

    def crash(record: dict) -> None:
        if record["round"] == 1:
            raise Crash

    run = tmp_path / "run"
    with pytest.raises(Crash):
        InProcessRunner(cfg, run).run(on_round=crash)
    out = CliRunner().invoke(app, ["run", "--resume", str(run)])
    assert out.exit_code == 0, out.output
    assert finished_run(run, cfg)
    # a config.yaml written before the fix holds both fields and still reads as the run's
    old = yaml.safe_load((run / "config.yaml").read_text())
    old["train"]["local_iters"] = 10
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    assert load_config(run / "config.yaml", run_dump=True) == cfg
    assert finished_run(run, cfg)
    with pytest.raises(ConfigError, match="not both"):
        load_config(run / "config.yaml")


def test_dice_foreground_is_the_sigmoid_dice_of_the_foreground_channel():
    """``dice_foreground`` on two logits is FedDP's code's loss on one sigmoid channel:
    ``1 - (2 sum(p t) + s) / (sum p + sum t + s)`` over the batch, ``p = sigmoid(z1 - z0)``."""
    sim = _sim(loss="dice_foreground")
    ctx = sim.context(sim.sites["site0"], 0)
    g = torch.Generator().manual_seed(0)  # random inputs may bring both losses within 1e-3
    logits = torch.randn(3, 2, 8, 8, generator=g)
    labels = torch.randint(0, 2, (3, 8, 8), generator=g)
    p, t = torch.sigmoid(logits[:, 1] - logits[:, 0]), labels.float()
    code = 1 - (2 * (p * t).sum() + 1e-5) / (p.sum() + t.sum() + 1e-5)
    assert float(segmentation_loss(ctx)(logits, labels)) == pytest.approx(float(code), abs=1e-6)
    both = segmentation_loss(replace(ctx, train=ctx.train.model_copy(update={"loss": "dice"})))
    assert float(both(logits, labels)) != pytest.approx(float(code), abs=1e-3)


def _one_sgd_step(clamp: float | None) -> torch.Tensor:
    sim = _sim(optimizer="sgd", momentum=0.0, weight_decay=0.0, lr=1.0, grad_clamp=clamp)
    before = torch.cat([p.detach().flatten().clone() for p in sim.model.parameters()])
    train_steps(sim.model, sim.context(sim.sites["site0"], 0), iters=1)
    return torch.cat([p.detach().flatten() for p in sim.model.parameters()]) - before


def test_grad_clamp_bounds_every_element_of_a_step():
    """With plain SGD at lr 1 a step moves each weight by its (clamped) gradient: no weight
    moves by more than the clamp, some by exactly it, and without the clamp some by more
    (to float32's rounding of the weights, 1e-6)."""
    free, clamped = _one_sgd_step(None).abs(), _one_sgd_step(1e-4).abs()
    assert free.max() > 1e-3
    assert clamped.max() <= 1e-4 + 1e-6
    assert int((clamped > 1e-4 - 1e-6).sum()) > 0


def test_fine_tuning_does_not_clamp():
    """FedDP's and FedBABU's code clamp the rounds' gradients, not the fine-tuning's."""
    from fedseg.methods.finetune import fine_tune

    sim = _sim("fedbabu", optimizer="sgd", momentum=0.0, weight_decay=0.0, grad_clamp=1e-6)
    ctx = sim.context(sim.sites["site0"], 0)
    cfg = sim.method.config.model_copy(update={"ft_epochs": 1, "ft_lr": 1.0, "ft_scope": "all"})
    before = [p.detach().clone() for p in sim.model.parameters()]
    fine_tune(sim.method, sim.model, ctx, cfg)
    after = list(sim.model.parameters())
    moved = max((p.detach() - b).abs().max() for p, b in zip(after, before, strict=True))
    assert float(moved) > 1e-3
