"""Central and local DP over Flower's site handlers equal the in-process run bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flower_helpers import direct_link, make_config

from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels
from fedseg.engine.flower.link import run_federation
from fedseg.engine.runner import InProcessRunner

PRIVACY = {"mode": "central", "clip": 0.3, "noise_multiplier": 0.7, "weighting": "samples"}
SMALL = {"name": "unet", "widths": [4, 8, 16], "dropout": [0, 0, 0]}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fed") / "fundus"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    generate_weak_labels(root, seed=0)
    return root


def test_dp_over_flower_equals_in_process(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedbn", privacy=PRIVACY, model=SMALL)
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, federation, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert res["sites"] == ref["sites"] and res["privacy"] == ref["privacy"]
    rounds = {
        name: [json.loads(x) for x in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
        for name in ("inproc", "flower")
    }
    assert [r["server"] for r in rounds["flower"]] == [r["server"] for r in rounds["inproc"]]
    assert rounds["flower"][-1]["server"]["dp_epsilon"] == res["privacy"]["epsilon"]
    ours = torch.load(tmp_path / "flower/checkpoints/last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "inproc/checkpoints/last.pt", weights_only=True)
    for k, v in theirs["server"]["payloads"][0]["tensors"].items():
        assert torch.equal(ours["server"]["payloads"][0]["tensors"][k], v), k


def test_local_dp_over_flower_equals_in_process(federation: Path, tmp_path: Path):
    """Local DP-SGD (FedRep's alternating head and body steps, weak labels: per-example
    pCE) gives the same models, metrics and per-site epsilon through Flower's handlers."""
    privacy = {"mode": "local", "clip": 0.5, "noise_multiplier": 0.8}
    model = {**SMALL, "widths": [8, 16, 32], "norm": "group"}
    cfg = make_config(federation, "fedrep", privacy=privacy, model=model)
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, federation, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert res["sites"] == ref["sites"] and res["privacy"] == ref["privacy"]
    assert res["privacy"]["epsilon"] > 0 and len(res["privacy"]["per_site"]) == 2
    rounds = {
        name: [json.loads(x) for x in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
        for name in ("inproc", "flower")
    }
    assert [r["clients"] for r in rounds["flower"]] == [r["clients"] for r in rounds["inproc"]]
    ours = torch.load(tmp_path / "flower/checkpoints/last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "inproc/checkpoints/last.pt", weights_only=True)
    for k, v in theirs["server"]["payloads"][0]["tensors"].items():
        assert torch.equal(ours["server"]["payloads"][0]["tensors"][k], v), k
