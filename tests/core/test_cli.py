import json

from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.export import load_exported

runner = CliRunner()


def _config(tmp_path, method="fedavg"):
    p = tmp_path / f"{method}.yaml"
    p.write_text(
        f"name: {method}\ndata:\n  root: {tmp_path / 'data'}\n  labels: weak\n"
        "  synth: {task: fundus, sites: 2, size: 32, per_site: 10}\n"
        f"method: {{name: {method}}}\ntrain: {{rounds: 2, local_iters: 1, batch_size: 2}}\n"
    )
    return p


def test_methods_lists_registered_methods():
    out = runner.invoke(app, ["methods"])
    assert out.exit_code == 0
    assert "fedavg" in out.output and "centralized" in out.output


def test_run_then_report(tmp_path):
    for m in ("fedavg", "local"):
        res = runner.invoke(app, ["run", str(_config(tmp_path, m)), "--out", str(tmp_path / m)])
        assert res.exit_code == 0, res.output
        assert "Average" in res.output and "DSC cup" in res.output
    # every run exports its evaluation models; local training has no global model
    assert sorted(p.name for p in (tmp_path / "fedavg/models").iterdir())[-1] == "global.pt"
    assert not (tmp_path / "local/models/global.pt").exists()
    site = sorted((tmp_path / "local/models").glob("*.pt"))[0]
    assert load_exported(site).info.to_dict()["class_names"][0] == "background"
    res = runner.invoke(
        app,
        [
            "run",
            str(_config(tmp_path)),
            "--set",
            "train.rounds=1",
            "--out",
            str(tmp_path / "short"),
        ],
    )
    assert res.exit_code == 0
    assert (
        json.loads((tmp_path / "short" / "results.json").read_text())["timing"][
            "round_seconds"
        ].__len__()
        == 1
    )
    out = tmp_path / "cmp.md"
    res = runner.invoke(
        app, ["report", str(tmp_path / "fedavg"), str(tmp_path / "local"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "## DSC" in text and "## HD95" in text
    assert "| fedavg |" in text and "| local |" in text and "Average cup" in text


def test_errors_exit_2_with_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {root: x}\nmethod: {name: fedavgg}\n")
    res = runner.invoke(app, ["run", str(bad), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "unknown method 'fedavgg'" in res.output
    res = runner.invoke(app, ["report", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no results.json" in res.output


def test_argument_help_texts_show() -> None:
    from typer.testing import CliRunner

    from fedseg.cli import app as cli_app

    out = CliRunner().invoke(cli_app, ["run", "--help"], terminal_width=200)
    assert out.exit_code == 0
    assert "YAML run configuration, or a shipped name" in out.output, out.output


def test_version() -> None:
    from fedseg import __version__

    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"fedseg {__version__}"


def test_install_hints_keep_the_extra(tmp_path, monkeypatch, capsys) -> None:
    """``[onnx]`` is not eaten as console markup: the printed hint installs the extra."""
    import sys

    import pytest
    import typer

    from fedseg.console import fail
    from fedseg.errors import ConfigError
    from fedseg.onnx_model import OnnxLabelMaps

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if the onnx extra were missing
    with pytest.raises(ConfigError) as missing:
        OnnxLabelMaps(tmp_path / "A.onnx")
    with pytest.raises(typer.Exit):
        fail(missing.value)
    assert "pip install 'fedseg[onnx]'" in capsys.readouterr().err
