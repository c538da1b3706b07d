"""Tracking: tiny runs with ``tracking.tensorboard`` on, read back with TensorBoard's
EventAccumulator and compared with rounds.jsonl; the MLflow hook's error without mlflow."""

from __future__ import annotations

import json
import sys

import pytest

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError
from fedseg.tracking import round_listener, round_matrices, round_scalars


def _config(tmp_path, method: dict, **extra):
    raw = {
        "name": method["name"],
        "data": {
            "root": str(tmp_path / "data"),
            "labels": "weak",
            "synth": {"task": "fundus", "sites": 2, "size": 32, "per_site": 10},
        },
        "method": method,
        "model": {"widths": [8, 16, 32], "dropout": [0, 0, 0]},
        "train": {"rounds": 2, "local_iters": 2, "batch_size": 2},
        **extra,
    }
    return parse_config(raw)


def _rounds(run_dir):
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def _events(run_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_tensorboard_logs_losses_aaw_weights_and_validation(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = _config(
        tmp_path,
        {"name": "fedavg_aaw"},
        tracking={"tensorboard": True},
        eval={"every": 1},
    )
    run_dir = tmp_path / "run"
    seen = []
    InProcessRunner(cfg, run_dir).run(on_round=seen.append)
    assert [r["round"] for r in seen] == [0, 1]  # the caller's callback still runs
    acc = _events(run_dir)
    tags = set(acc.Tags()["scalars"])
    rounds = _rounds(run_dir)
    for rec in rounds:
        step = rec["round"] + 1
        for site, metrics in rec["clients"].items():
            (ev,) = [e for e in acc.Scalars(f"client/loss/{site}") if e.step == step]
            assert ev.value == pytest.approx(metrics["loss"], rel=1e-6)
        for site, w in rec["server"]["aaw_weights"].items():
            (ev,) = [e for e in acc.Scalars(f"server/aaw_weights/{site}") if e.step == step]
            assert ev.value == pytest.approx(w, rel=1e-6)
    # DSC of the periodic evaluation (after round 1 of 2), per site and region
    evaluated = [r for r in rounds if "eval" in r]
    assert evaluated
    for site, regions in evaluated[0]["eval"].items():
        for region, dsc in regions.items():
            (ev,) = acc.Scalars(f"eval_dsc/{site}/{region}")
            assert ev.step == evaluated[0]["round"] + 1 and ev.value == pytest.approx(dsc)
    assert {"time/seconds", "comm/upload_bytes", "sites/participants"} <= tags


def test_tensorboard_logs_affinity_and_la_statistics(tmp_path):
    pytest.importorskip("tensorboard")
    method = {"name": "fedlppa", "la_skip_rounds": 0}  # LA from round 2 of the 2
    cfg = _config(tmp_path, method, tracking={"tensorboard": True})
    run_dir = tmp_path / "run"
    InProcessRunner(cfg, run_dir).run()
    acc = _events(run_dir)
    rec = _rounds(run_dir)[-1]
    aff = rec["server"]["affinity"]
    names = rec["server"]["affinity_sites"]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            (ev,) = [e for e in acc.Scalars(f"server/affinity/{a}/{b}") if e.step == 2]
            assert ev.value == pytest.approx(aff[i][j], rel=1e-6)
    assert "server/affinity" in acc.Tags()["images"]
    la = [k for k in rec["clients"][names[0]] if k.startswith("la_")]
    assert la, "fedlppa records LA weight statistics"
    assert all(f"client/{k}/{names[0]}" in acc.Tags()["scalars"] for k in la)


def test_defaults_tracking_off_periodic_evaluation_on(tmp_path):
    cfg = _config(tmp_path, {"name": "fedavg"})
    assert not cfg.tracking.tensorboard and not cfg.tracking.mlflow
    assert cfg.eval.every == 1  # 2 rounds: evaluated after round 1
    res = InProcessRunner(cfg, tmp_path / "run").run()
    assert not (tmp_path / "run" / "tensorboard").exists()
    first, last = _rounds(tmp_path / "run")
    assert set(first["eval"]) == set(res["sites"]) and "eval" not in last


@pytest.mark.parametrize(("rounds", "every"), [(1, 1), (4, 1), (20, 5), (100, 25)])
def test_default_evaluation_interval_gives_three_evaluations(tmp_path, rounds, every):
    cfg = _config(tmp_path, {"name": "fedavg"}, train={"rounds": rounds})
    assert cfg.eval.every == every
    explicit = _config(tmp_path, {"name": "fedavg"}, train={"rounds": rounds}, eval={"every": 0})
    assert explicit.eval.every == 0


def test_mlflow_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow -> ImportError
    cfg = _config(tmp_path, {"name": "fedavg"}, tracking={"mlflow": True})
    with pytest.raises(ConfigError, match=r"tracking\.mlflow: the mlflow package"):
        InProcessRunner(cfg, tmp_path / "run").run()


def test_unknown_tracking_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"tracking\.wandb: unknown key"):
        _config(tmp_path, {"name": "fedavg"}, tracking={"wandb": True})


def test_round_flattening_of_matrices_and_mappings():
    rec = {
        "round": 0,
        "clients": {"A": {"loss": 0.5, "note": "x"}, "B": {"loss": 0.25}},
        "server": {
            "aux_weights": [[0.75, 0.25], [0.5, 0.5]],
            "affinity_sites": ["A", "B"],
            "aaw_step": 0.1,
            "aaw_weights": {"A": 0.6, "B": 0.4},
        },
        "comm": {"upload": {"A": {"bytes": 10, "values": 2}, "B": {"bytes": 5, "values": 1}}},
        "participants": ["A", "B"],
        "failures": {},
    }
    s = round_scalars(rec)
    assert s["client/loss/B"] == 0.25 and "client/note/A" not in s
    assert s["server/aux_weights/B/A"] == 0.5 and s["server/aaw_weights/A"] == 0.6
    assert s["server/aaw_step"] == 0.1 and s["comm/upload_bytes"] == 15.0
    assert round_matrices(rec)["aux_weights"][1] == ["A", "B"]


def test_listener_passes_through_when_off(tmp_path):
    cfg = parse_config({"data": {"root": str(tmp_path)}})

    def callback(record):
        return None

    with round_listener(cfg.tracking, tmp_path, callback) as hook:
        assert hook is callback
