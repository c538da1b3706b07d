"""Configs ship inside the package: listed, shown, copied and run by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import load_config
from fedseg.configs import PACKAGED_CONFIGS, packaged_configs, resolve_config

runner = CliRunner()


def test_every_shipped_config_is_valid() -> None:
    names = packaged_configs()
    assert {"quickstart", "fedlppa/table7_full", "fedbcs/fedbcs", "vc/table1_ours"} <= set(names)
    for name in names:
        load_config(name)  # raises ConfigError naming the file otherwise


def test_names_resolve_inside_the_package_and_paths_win(tmp_path, monkeypatch) -> None:
    assert resolve_config("quickstart") == PACKAGED_CONFIGS / "quickstart.yaml"
    assert resolve_config("fedlppa/table7_full.yaml").parent.name == "fedlppa"
    monkeypatch.chdir(tmp_path)
    Path("quickstart").write_text("name: mine\n")  # a local file of that name is used
    assert resolve_config("quickstart") == Path("quickstart")


def test_configs_list_show_copy(tmp_path) -> None:
    out = runner.invoke(app, ["configs", "list", "fedbcs/"], terminal_width=200)
    assert out.exit_code == 0 and "fedbcs/fedbcs " in out.output and "quickstart" not in out.output
    out = runner.invoke(app, ["configs", "show", "quickstart"])
    assert out.exit_code == 0 and "name: quickstart" in out.output
    dest = tmp_path / "qs.yaml"
    assert runner.invoke(app, ["configs", "copy", "quickstart", str(dest)]).exit_code == 0
    assert load_config(dest).name == "quickstart"
    again = runner.invoke(app, ["configs", "copy", "quickstart", str(dest)])
    assert again.exit_code == 2 and "exists" in again.output


@pytest.mark.parametrize("name", ["quickstart", "nope/none"])
def test_run_by_name(tmp_path, monkeypatch, name) -> None:
    monkeypatch.chdir(tmp_path)  # outside the repository: only the package holds configs
    out = runner.invoke(
        app,
        ["run", name, "--out", "r", "--set", "train.rounds=1", "--set", "train.local_iters=1",
         "--set", "data.synth.sites=2", "--set", "data.synth.per_site=8",
         "--set", "data.synth.size=32", "--set", "eval.save_models=false",
         "--set", "train.batch_size=2"],
    )  # fmt: skip
    if name == "quickstart":
        assert out.exit_code == 0, out.output
        assert (tmp_path / "r/results.json").exists()
    else:
        assert out.exit_code == 2 and "fedseg configs list" in out.output


def test_configs_show_piped_is_the_file_itself() -> None:
    """``fedseg configs show NAME > my.yaml`` writes the shipped YAML unwrapped (a config
    with lines longer than 80 columns used to be cut into invalid YAML)."""
    name = "vc/table3_vc_paa_shared_polyp"
    text = resolve_config(name).read_text()
    assert max(len(line) for line in text.splitlines()) > 80
    out = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "configs", "show", name],
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == text
    assert yaml.safe_load(out.stdout) == yaml.safe_load(text)
