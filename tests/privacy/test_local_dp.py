"""Local DP-SGD: per-example clipping, calibrated noise, accountant, repeatable runs, refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from scipy.stats import norm
from torch import nn

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.server import make_method
from fedseg.engine.sites import client_context
from fedseg.errors import ConfigError
from fedseg.methods.base import TrainSettings
from fedseg.methods.training import step_loop, train_steps
from fedseg.privacy import PrivacySettings, sgd_epsilon, steps_within_budget
from fedseg.privacy import supported_local_methods as supported
from fedseg.privacy.central import update_norm
from fedseg.privacy.local import DPSGD
from fedseg.reporting.compare import build_report, report_markdown
from fedseg.reporting.results import site_table
from fedseg.reporting.runs import load_run
from fedseg.testing import synth_folder, toy_federation

SMALL = {"name": "unet", "widths": [8, 16, 32], "dropout": [0, 0, 0], "norm": "group"}


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "faz", "faz", sites=3, per_site=6)


def _cfg(root: Path, privacy: dict, method="fedavg", model=SMALL, seed=3, rounds=2):
    return parse_config(
        {
            "seed": seed,
            "data": {"root": str(root), "labels": "full"},
            "method": {"name": method},
            "model": model,
            "train": {"rounds": rounds, "local_iters": 2, "batch_size": 2, "augment": False},
            "eval": {"every": 0},
            "engine": {"device": "cpu"},
            "privacy": {"mode": "local", **privacy},
        }
    )


def _step(model: nn.Module, privacy: dict, loss_fn, iters: int = 1, n_train: int = 8):
    """``iters`` DP-SGD steps (plain SGD, lr 1) of ``model`` on site0 of a toy federation;
    returns (parameter change, examples sampled per step)."""
    spec, data = toy_federation(1, n_train=n_train, size=8, labels="full")
    train = TrainSettings(optimizer="sgd", lr=1.0, momentum=0.0, weight_decay=0.0, batch_size=4)
    ctx = client_context(
        data["site0"], spec, train, round_index=0, seed=5, model=model, device=torch.device("cpu")
    )
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(ctx.generator.initial_seed())
    settings = PrivacySettings(mode="local", **privacy)
    with step_loop(DPSGD(settings, ctx, 0)):
        train_steps(model, ctx, loss_fn, iters=iters)
    sampled = []
    for _ in range(iters):  # the same Poisson draws, replayed; then the step's noise
        sampled.append(int((torch.rand(n_train, generator=gen) < 4 / n_train).sum()))
        for p in before.values():
            torch.randn(p.shape, generator=gen)
    moved = {k: v.detach() - before[k] for k, v in model.named_parameters()}
    return moved, sampled


def test_clipping_bounds_each_examples_contribution():
    """Examples with the same gradient far above clip (only the bias trains): each sampled
    example moves the model by exactly clip / batch_size (noise made negligible)."""
    clip = 0.25
    for scale in (1e3, 1e6):
        model = nn.Conv2d(1, 2, 1)
        model.weight.requires_grad_(False)
        moved, sampled = _step(
            model,
            {"clip": clip, "noise_multiplier": 1e-9},
            lambda out, _y, s=scale: s * out[:, 1].mean(),
        )
        assert sampled[0] > 0
        assert update_norm(moved) == pytest.approx(sampled[0] * clip / 4, rel=1e-5)


def test_noise_has_the_calibrated_standard_deviation():
    """A loss without gradient: each step moves every parameter by N(0, (z clip / B)^2)."""
    z, clip, batch = 1.5, 0.2, 4
    model = nn.Conv2d(1, 64, 5)  # 1,664 parameters
    moved, _ = _step(
        model, {"clip": clip, "noise_multiplier": z}, lambda out, _y: 0 * out.sum(), iters=12
    )
    x = torch.cat([v.flatten() for v in moved.values()]) / math.sqrt(12)  # a sum of 12 steps
    n, sd = x.numel(), z * clip / batch
    # sample sd within 6 standard errors (sd / sqrt(2n)), mean within 6 (sd / sqrt(n)), and
    # the share beyond 2 sd as the normal tail within 6 standard errors
    assert abs(float(x.std()) - sd) < 6 * sd / math.sqrt(2 * n)
    assert abs(float(x.mean())) < 6 * sd / math.sqrt(n)
    tail, p = float((x.abs() > 2 * sd).double().mean()), 2 * norm.sf(2)
    assert abs(tail - p) < 6 * math.sqrt(p * (1 - p) / n)


def test_accountant_matches_the_library_and_the_budget():
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    settings = PrivacySettings(mode="local", noise_multiplier=1.1, delta=1e-5)
    event = dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(1.1))
    for steps in (1, 10, 39):
        acc = RdpAccountant(tuple(range(2, 257))).compose(event, steps)
        assert sgd_epsilon(settings, 0.05, steps) == pytest.approx(acc.get_epsilon(1e-5))
    # the tighter PLD accountant of the same library stays below, and not far below
    pld = (
        dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
        .compose(event, 39)
        .get_epsilon(1e-5)
    )
    assert 0.7 * sgd_epsilon(settings, 0.05, 39) < pld <= sgd_epsilon(settings, 0.05, 39)
    target = settings.model_copy(update={"target_epsilon": sgd_epsilon(settings, 0.05, 25)})
    assert steps_within_budget(target, 0.05) == 25


def _rounds(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "rounds.jsonl").read_text().splitlines()]


def test_local_dp_run_is_repeatable_resumable_reports_epsilon_per_site_and_stops_at_target(
    fed_root, tmp_path
):
    privacy = {"clip": 0.5, "noise_multiplier": 0.9, "delta": 1e-4}
    settings = PrivacySettings(mode="local", **privacy)
    runs = {
        n: InProcessRunner(_cfg(fed_root, privacy, seed=s), tmp_path / n).run()
        for n, s in (("a", 3), ("b", 3), ("c", 4))
    }

    def model(name):
        ck = torch.load(tmp_path / name / "checkpoints/last.pt", weights_only=True)
        return ck["server"]["payloads"][0]["tensors"]

    a, b, c = model("a"), model("b"), model("c")
    assert all(torch.equal(a[k], b[k]) for k in a) and runs["a"]["sites"] == runs["b"]["sites"]
    assert any(not torch.equal(a[k], c[k]) for k in a)
    rounds = _rounds(tmp_path / "a")
    report = runs["a"]["privacy"]
    for r, record in enumerate(rounds):
        for site, m in record["clients"].items():
            assert m["dp_steps"] == 2 * (r + 1)
            assert m["dp_epsilon"] == sgd_epsilon(settings, m["dp_sampling_rate"], 2 * (r + 1))
            assert report["per_site"][site] == rounds[-1]["clients"][site]["dp_epsilon"]
    assert report["epsilon"] == max(report["per_site"].values()) > 0
    assert report["mode"] == "local" and report["delta"] == 1e-4
    line = f"(local): clip 0.5, noise multiplier 0.9, ε = {report['epsilon']:.3g} (largest"
    assert line in site_table(runs["a"])  # results.md, and the report of the run
    assert line in report_markdown(build_report([load_run(tmp_path / "a")]))

    class Crash(Exception):
        pass

    def crash_after_round_1(record):
        if record["round"] == 0:
            raise Crash

    with pytest.raises(Crash):  # resumed: the steps so far come back with the site's state
        InProcessRunner(_cfg(fed_root, privacy), tmp_path / "r").run(on_round=crash_after_round_1)
    resumed = InProcessRunner(_cfg(fed_root, privacy), tmp_path / "r").run(resume=True)
    assert resumed["sites"] == runs["a"]["sites"] and resumed["privacy"] == report
    assert [r["clients"] for r in _rounds(tmp_path / "r")] == [r["clients"] for r in rounds]

    rate = rounds[0]["clients"]["A"]["dp_sampling_rate"]
    target = {**privacy, "target_epsilon": sgd_epsilon(settings, rate, 3)}
    res = InProcessRunner(_cfg(fed_root, target), tmp_path / "t").run()
    last = _rounds(tmp_path / "t")[-1]["clients"]["A"]
    assert last["dp_steps"] == 3 and res["privacy"]["per_site"]["A"] <= target["target_epsilon"]


@pytest.mark.parametrize("method", supported())
def test_every_supported_method_runs_with_local_dp(fed_root, tmp_path, method):
    cfg = _cfg(fed_root, {"clip": 0.5, "noise_multiplier": 0.8}, method, rounds=1)
    res = InProcessRunner(cfg, tmp_path / "r").run()
    record = _rounds(tmp_path / "r")[0]
    assert len(record["participants"]) == 3 and not record["failures"]
    assert all(m["dp_steps"] >= 2 for m in record["clients"].values())
    assert res["privacy"]["epsilon"] > 0


@pytest.mark.parametrize(
    ("method", "why"),
    [
        ("fedala", "ALA step"),
        ("fedbn", "private parts are the BatchNorm layers"),
        ("fedavg_aaw", "validation loss"),
        ("centralized", "pools every site's data"),
        ("moon", "outside the per-example DP-SGD steps"),
        ("fedlppa", "outside the per-example DP-SGD steps"),
    ],
)
def test_methods_outside_dp_sgd_refuse(method, why):
    with pytest.raises(
        ConfigError, match=rf"privacy.mode local: method '{method}' is not supported: .*{why}"
    ):
        _cfg(Path("x"), {}, method=method)


def test_batch_norm_networks_refuse():
    cfg = _cfg(Path("unused"), {}, model={**SMALL, "norm": "batch"})
    with pytest.raises(ConfigError, match=r"BatchNorm layers .* set model.norm: group or instance"):
        make_method(cfg, toy_federation(3)[0])
