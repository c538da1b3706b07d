"""Run settings refused (or not) as they should be: a site with an empty train split only
where the run uses it, ``engine.channels_last`` with one word of what it got, and
``fedseg predict`` on a path that does not exist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import parse_config
from fedseg.engine.prepare import prepare_data
from fedseg.errors import ConfigError, DataError
from fedseg.testing import synth_folder


def _raw(root: Path, **data) -> dict:
    return {
        "seed": 0,
        "data": {"root": str(root), "labels": "full", **data},
        "method": {"name": "fedavg"},
        "train": {"rounds": 1, "local_iters": 1, "batch_size": 2},
    }


def test_an_empty_train_split_is_refused_only_where_the_run_uses_the_site(tmp_path):
    root = synth_folder(tmp_path / "fed", "polyp", sites=3, per_site=8)
    shutil.rmtree(root / "sites" / "A" / "train")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["sites"][0]["splits"]["train"] = 0
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="site 'A' has an empty train split"):
        prepare_data(parse_config(_raw(root)))
    with pytest.raises(DataError, match="site 'A' has an empty train split"):
        prepare_data(parse_config(_raw(root, sites=["A", "B"])))
    assert prepare_data(parse_config(_raw(root, sites=["B", "C"]))) == root


def test_a_bad_channels_last_says_what_it_got_once(tmp_path):
    raw = {**_raw(tmp_path), "engine": {"channels_last": "maybe"}}
    with pytest.raises(ConfigError) as e:
        parse_config(raw, "run.yaml")
    assert e.value.reason == (
        "run.yaml: engine.channels_last: expected auto, true or false (got 'maybe')"
    )
    for word, value in (("off", False), ("on", True), ("auto", "auto")):
        raw["engine"]["channels_last"] = yaml.safe_load(word)
        assert parse_config(raw).engine.channels_last == value


def test_predict_names_a_missing_source(tmp_path):
    missing = tmp_path / "no-such-run"
    args = ["predict", str(missing), "--input", str(tmp_path), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    said = "".join(res.output.split())
    assert f"{missing}:nosuchrundirectoryorexportedmodel" in said
    assert "--site" not in res.output
