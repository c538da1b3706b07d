"""A run's synthetic federation depends on ``data.synth``, never on the run's own seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fedseg.config import parse_config
from fedseg.engine.prepare import prepare_data
from fedseg.errors import ConfigError


def _cfg(root: Path, run_seed: int, **synth: object):
    raw = {
        "name": "prep",
        "seed": run_seed,
        "data": {"root": str(root), "synth": {"task": "fundus", "sites": 2, "size": 32, **synth}},
        "train": {"rounds": 1, "local_iters": 1, "batch_size": 2},
    }
    return parse_config(raw, "<test>")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted((root / "sites").rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_runs_of_other_seeds_build_the_same_federation(tmp_path):
    first = prepare_data(_cfg(tmp_path / "a", run_seed=2))
    second = prepare_data(_cfg(tmp_path / "b", run_seed=0))
    assert _digest(first) == _digest(second)
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["synth_seed"] == 0 and manifest["weak_labels"]["seed"] == 0
    other = prepare_data(_cfg(tmp_path / "c", run_seed=0, seed=1))
    assert _digest(other) != _digest(first)  # data.synth.seed draws another federation


def test_a_folder_of_another_synthesis_seed_is_refused(tmp_path):
    root = prepare_data(_cfg(tmp_path / "fed", run_seed=0))
    prepare_data(_cfg(root, run_seed=1))  # another run seed: the same federation, accepted
    with pytest.raises(ConfigError, match=r"synthesized with seed 0, but data\.synth\.seed is 1"):
        prepare_data(_cfg(root, run_seed=0, seed=1))


def test_a_folder_without_a_recorded_synthesis_seed_is_refused(tmp_path):
    root = prepare_data(_cfg(tmp_path / "fed", run_seed=0))
    manifest = json.loads((root / "manifest.json").read_text())
    del manifest["synth_seed"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="before fedseg recorded the synthesis seed"):
        prepare_data(_cfg(root, run_seed=0))


def test_weak_labels_of_another_seed_are_refused(tmp_path):
    from fedseg.data.weak import generate_weak_labels

    root = prepare_data(_cfg(tmp_path / "fed", run_seed=0))
    generate_weak_labels(root, seed=3)  # redrawn by hand with another seed
    with pytest.raises(ConfigError, match="weak labels drawn with seed 3"):
        prepare_data(_cfg(root, run_seed=0))


def test_a_kept_local_run_that_predates_the_synthesis_seed_is_trained_afresh(tmp_path):
    """``fedseg reproduce`` reuses a finished run in its output folder; one made before runs
    recorded ``data.synth.seed`` may have seen another federation, so it is run again."""
    import yaml

    from fedseg.reproduce.runs import predates_synth_seed, run_config

    raw = _cfg(tmp_path / "fed", run_seed=1).model_dump(mode="json")
    run = tmp_path / "run"
    run_config(raw, run)
    results = run / "results.json"
    results.write_text(results.read_text().replace('"seed": 1', '"seed": 1, "marker": 1', 1))
    run_config(raw, run)  # a run of today's config is reused
    assert '"marker"' in results.read_text()
    stored = yaml.safe_load((run / "config.yaml").read_text())
    del stored["data"]["synth"]["seed"]
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    assert predates_synth_seed(run, parse_config(raw, "<test>"))
    run_config(raw, run)
    assert '"marker"' not in results.read_text()  # trained again
    assert not predates_synth_seed(run, parse_config(raw, "<test>"))
