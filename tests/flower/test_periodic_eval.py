"""The periodic evaluation during training scores the validation split (full masks) by
default, identically in-process and over Flower, and never changes the run's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flower_helpers import assert_same_metrics, direct_link, make_config

from fedseg.engine.flower.link import run_federation
from fedseg.engine.runner import InProcessRunner

pytestmark = pytest.mark.flower


def _evals(run: Path) -> list[dict]:
    lines = (run / "rounds.jsonl").read_text().splitlines()
    return [json.loads(x)["eval"] for x in lines if "eval" in json.loads(x)]


def test_periodic_evaluation_scores_val_in_both_engines(federation_with_val, tmp_path):
    cfg = make_config(federation_with_val, "fedavg", rounds=3, eval={"every": 1, "batch_size": 8})
    assert cfg.eval.periodic_split == "val"
    ref = InProcessRunner(cfg, tmp_path / "val").run()
    link, st = direct_link(cfg, federation_with_val, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    val_evals = _evals(tmp_path / "val")
    assert len(val_evals) == 2 and val_evals == _evals(tmp_path / "flower")
    assert_same_metrics(res["sites"], ref["sites"], 0.0)

    on_test = cfg.model_copy(
        update={"eval": cfg.eval.model_copy(update={"periodic_split": "test"})}
    )
    test_ref = InProcessRunner(on_test, tmp_path / "test").run()
    assert_same_metrics(test_ref["sites"], ref["sites"], 0.0)  # scoring never perturbs training
    assert _evals(tmp_path / "test") != val_evals  # another split, other scores
    assert set(val_evals[-1]) == set(ref["sites"])


def test_sites_without_a_validation_split_are_left_out(tmp_path):
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    root = tmp_path / "noval"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0, split=(0.8, 0.0, 0.2))
    generate_weak_labels(root, seed=0)
    cfg = make_config(root, "fedavg", rounds=2, eval={"every": 1, "batch_size": 8})
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"sites": None})})
    InProcessRunner(cfg, tmp_path / "r").run()
    assert _evals(tmp_path / "r") == [{}]
