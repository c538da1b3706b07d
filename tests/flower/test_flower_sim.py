"""The flower-sim backend: a federation on Flower's Ray-based simulation engine gives exactly
the in-process engine's results (one test: starting Ray takes a while)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from flower_helpers import SITES, assert_same_metrics, make_config
from typer.testing import CliRunner

from fedseg.backends import SimSettings, sim_settings
from fedseg.cli import app as cli
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError

pytestmark = pytest.mark.flower


def test_backend_settings_are_checked_and_named():
    assert sim_settings("inprocess") is None
    assert sim_settings("flower-sim") == SimSettings()
    sim = sim_settings({"name": "flower-sim", "cpus": 2, "gpus": 0.25, "ray_address": "auto"})
    assert (sim.cpus, sim.gpus, sim.ray_address) == (2, 0.25, "auto")
    for bad, field in [
        ("ray", "engine.backend: unknown backend 'ray'"),
        ({"name": "flower-sim", "gpus": -1}, "engine.backend.gpus"),
        ({"name": "flower-sim", "cpu": 1}, "engine.backend.cpu"),
        ({"name": "inprocess", "cpus": 1}, "inprocess backend takes no settings"),
    ]:
        with pytest.raises(ConfigError, match=field):
            sim_settings(bad)


@pytest.mark.slow
def test_fedbn_on_flower_sim_equals_in_process(federation: Path, tmp_path: Path):
    """`fedseg run CONFIG --engine flower-sim`: two sites as Ray actors (one CPU each) train
    FedBN (private BN layers, kept in the sites' state files) for two rounds; results and the
    global model are bit-identical to the in-process engine's."""
    cfg = make_config(federation, "fedbn", engine={"device": "cpu", "threads": 1})
    ref = InProcessRunner(cfg, tmp_path / "ref").run()
    config = tmp_path / "fedbn.yaml"
    raw = cfg.model_dump(mode="json")
    raw["engine"]["backend"] = {"name": "inprocess"}
    config.write_text(yaml.safe_dump(raw))
    run = tmp_path / "sim"
    out = CliRunner().invoke(cli, ["run", str(config), "--out", str(run), "--engine", "flower-sim"])
    assert out.exit_code == 0, out.output
    res = json.loads((run / "results.json").read_text())
    assert res["engine"] == "flower-sim"
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    assert res["communication"] == ref["communication"]
    assert res["participation"] == dict.fromkeys(SITES, 2)
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)["server"]
    ck_ref = torch.load(tmp_path / "ref/checkpoints/last.pt", weights_only=True)["server"]
    ours = ck["payloads"][ck["payload_of"]["A"]]["tensors"]
    for k, v in ck_ref["payloads"][ck_ref["payload_of"]["A"]]["tensors"].items():
        assert torch.equal(ours[k], v), k
    for s in SITES:  # private BN layers live in the sites' own state files
        saved = sorted((run / "sites" / s).glob("*/round-*.pt"))
        assert saved and "weights" in torch.load(saved[-1], weights_only=True)["method"]
