"""The ``privacy:`` block's refusals and readings: YAML's ``off``, central-only weighting,
noise too large to leave a model (named up front), the accountant at extreme multipliers,
a target epsilon no round fits, and a global model that turned non-finite (never
checkpointed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import parse_config
from fedseg.engine.rundir import RunDir
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.server import ServerCore
from fedseg.errors import ConfigError
from fedseg.privacy import PrivacySettings, epsilon, sgd_epsilon
from fedseg.testing import synth_folder


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "faz", "faz", sites=3, per_site=6)


def _raw(root: Path, privacy: object, rounds: int = 2) -> dict:
    return {
        "seed": 0,
        "data": {"root": str(root), "labels": "full"},
        "method": {"name": "fedavg"},
        "model": {"name": "unet", "widths": [8, 16], "dropout": [0, 0], "norm": "group"},
        "train": {"rounds": rounds, "local_iters": 2, "batch_size": 4, "augment": False},
        "eval": {"every": 0, "save_models": False},
        "engine": {"device": "cpu"},
        "privacy": privacy,
    }


def test_mode_off_as_yaml_reads_it(tmp_path):
    block = yaml.safe_load("privacy: {mode: off}")["privacy"]
    assert block == {"mode": False}  # what YAML makes of the docs' spelling
    cfg = parse_config(_raw(tmp_path, block))
    assert cfg.privacy.mode == "off" and not cfg.privacy.enabled
    with pytest.raises(ConfigError, match=r"privacy\.mode"):
        parse_config(_raw(tmp_path, {"mode": True}))  # on: which mode? still refused


def test_weighting_is_central_only(tmp_path):
    with pytest.raises(ConfigError, match=r"privacy: weighting: samples needs mode: central"):
        parse_config(_raw(tmp_path, {"mode": "local", "weighting": "samples"}))
    assert parse_config(_raw(tmp_path, {"mode": "central", "weighting": "samples"}))


@pytest.mark.parametrize(
    ("privacy", "named"),
    [
        ({"noise_multiplier": 1e300}, r"noise_multiplier 1e\+300: expected at most 1e\+06"),
        ({"noise_multiplier": 1e100}, r"noise_multiplier 1e\+100: expected at most"),
        ({"clip": 1e30}, r"clip 1e\+30 \* noise_multiplier 1 = 1e\+30: the noise's standard"),
        ({"mode": "local", "clip": 1e7}, r"clip 1e\+07 \* noise_multiplier"),
    ],
)
def test_noise_that_leaves_no_model_is_refused_up_front_naming_the_setting(
    tmp_path, privacy, named
):
    with pytest.raises(ConfigError, match=named):
        parse_config(_raw(tmp_path, {"mode": "central", **privacy}))


def test_the_accountant_names_the_setting_where_its_arithmetic_breaks():
    tiny = PrivacySettings(mode="local", noise_multiplier=1e-300)
    with pytest.raises(ConfigError, match=r"privacy\.noise_multiplier 1e-300: the accountant"):
        sgd_epsilon(tiny, 0.5, 3)
    huge = PrivacySettings.model_construct(mode="central", noise_multiplier=1e300, delta=1e-5)
    with pytest.raises(ConfigError, match=r"privacy\.noise_multiplier 1e\+300"):
        epsilon(huge, 3)  # an OverflowError inside dp-accounting without the guard
    assert math.isfinite(epsilon(PrivacySettings(mode="central", noise_multiplier=1e6), 3))


def test_a_target_epsilon_no_round_fits_is_refused_before_training(tmp_path, fed_root):
    privacy = {"mode": "central", "target_epsilon": 0.01}
    first = epsilon(PrivacySettings(**privacy), 1)
    assert first > 0.01
    config = tmp_path / "dp.yaml"
    config.write_text(yaml.safe_dump(_raw(fed_root, privacy)))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "privacy.target_epsilon 0.01: already round 1's release takes epsilon to" in said
    assert f"{first:.3g}" in said and "no checkpoint" not in said
    assert not RunDir(out).results_json.exists() and not RunDir(out).rounds()


def test_a_non_finite_global_model_is_not_checkpointed(tmp_path, fed_root, monkeypatch):
    cfg = parse_config(_raw(fed_root, {"mode": "central", "noise_multiplier": 0.5}))
    real = ServerCore.finish

    def finish_then_overflow(self, agg):  # round 2's aggregate overflows float32
        metrics = real(self, agg)
        if len(RunDir(tmp_path / "run").rounds()) == 1:
            for payload in self.payloads.values():
                next(t for t in payload.tensors.values() if t.is_floating_point()).mul_(1e39)
        return metrics

    monkeypatch.setattr(ServerCore, "finish", finish_then_overflow)
    with pytest.raises(ConfigError, match=r"round 2: the model sent to site .* non-finite"):
        InProcessRunner(cfg, tmp_path / "run").run()
    rd = RunDir(tmp_path / "run")
    assert [r["round"] for r in rd.rounds()] == [0]  # round 2 is not recorded
    ck = rd.load_checkpoint()
    assert ck["round"] == 0  # the checkpoint is round 1's, and finite
    for payload in ck["server"]["payloads"]:
        assert all(bool(torch.isfinite(t).all()) for t in payload["tensors"].values())
