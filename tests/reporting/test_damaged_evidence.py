"""``fedseg reproduce`` over damaged evidence: an ``--evidence`` that is a file is refused
before anything trains; a kept run that cannot be read stops the table naming the file and
is never replaced, unless ``--rerun`` asks for it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from test_verdicts import toy_paper  # noqa: F401  (the toy paper of the verdict tests)
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.errors import ConfigError
from fedseg.reproduce.harness import reproduce


@pytest.fixture
def kept(tmp_path, toy_paper):  # noqa: F811
    """The evidence folder of the toy table with row A's run kept (``runs/a/seed0``)."""
    raw, write = toy_paper
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=evidence)
    shutil.rmtree(tmp_path / "out")
    return evidence


def test_an_evidence_file_is_refused_before_anything_trains(tmp_path, toy_paper):  # noqa: F811
    raw, write = toy_paper
    write(raw)
    (tmp_path / "page.md").write_text("not a folder\n")
    with pytest.raises(ConfigError, match=r"--evidence .*page\.md: is a file, expected a folder"):
        reproduce("toy", "t", "evidence", tmp_path / "out", evidence=tmp_path / "page.md")
    assert not (tmp_path / "out").exists()
    args = ["reproduce", "toy", "t", "--budget", "evidence", "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(app, [*args, "--evidence", str(tmp_path / "page.md")])
    assert res.exit_code == 2 and "is a file, expected a folder" in res.output


def _damage(run: Path, what: str) -> str:
    """Damage one kept file; the file's name and what the error says about it."""
    if what == "results cut":
        text = (run / "results.json").read_text()
        (run / "results.json").write_text(text[: len(text) // 2])
        return "results.json: unreadable results"
    lines = (run / "cases.csv").read_text().splitlines(keepends=True)
    if what == "cases abc":
        lines[3] = ",".join([*lines[3].split(",")[:-1], "abc"]) + "\n"
        (run / "cases.csv").write_text("".join(lines))
        return "cases.csv:4: value 'abc' is no number"
    if what == "cases cut":  # cut at a line end: the run's last case lacks values
        (run / "cases.csv").write_text("".join(lines[:-1]))
        return "cases.csv: site"
    if what == "config yaml":
        (run / "config.yaml").write_text("train: [rounds\n")
        return "config.yaml: cannot read the run's config"
    assert what == "config value"
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("rounds: 2", "rounds: two", 1))
    return "config.yaml: train.rounds"


@pytest.mark.parametrize(
    "what", ["results cut", "cases abc", "cases cut", "config yaml", "config value"]
)
def test_a_kept_run_that_cannot_be_read_stops_the_table_untouched(tmp_path, kept, what):
    run = kept / "runs" / "a" / "seed0"
    says = _damage(run, what)
    before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    for rows in (["A"], ["B"], None):  # rerun A, another row or all: the page reads A
        with pytest.raises(ConfigError) as e:
            reproduce("toy", "t", "evidence", tmp_path / "out", rows=rows, evidence=kept)
        assert f"{run}/{says}" in e.value.reason and "--rerun" in e.value.reason
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "out").exists()  # nothing trained


def test_rerun_replaces_the_kept_run_when_asked(tmp_path, kept):
    run = kept / "runs" / "a" / "seed0"
    _damage(run, "config yaml")
    rep = reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=kept, rerun=True)
    assert (tmp_path / "out" / "a" / "seed0" / "results.json").is_file()  # trained again
    assert rep.rows[0].dirs == [tmp_path / "out" / "a" / "seed0"]
    for name in ("config.yaml", "results.json", "cases.csv"):
        assert (run / name).read_bytes() == (tmp_path / "out" / "a" / "seed0" / name).read_bytes()
    # an intact kept run is reused again (nothing trains), and --rerun leaves the page's command
    shutil.rmtree(tmp_path / "out")
    reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=kept)
    assert not (tmp_path / "out" / "a").exists()


def test_a_kept_run_of_other_settings_is_not_replaced_unasked(tmp_path, kept):
    # e.g. a default changed since the run was kept: it is replaced only with --rerun
    run = kept / "runs" / "a" / "seed0"
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["train"]["lr"] = 0.5
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    before = (run / "results.json").read_bytes()
    with pytest.raises(ConfigError, match=r"train\.lr=0\.5, this run has .*--rerun"):
        reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=kept)
    assert (run / "results.json").read_bytes() == before and not (tmp_path / "out").exists()
    reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=kept, rerun=True)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] != 0.5
