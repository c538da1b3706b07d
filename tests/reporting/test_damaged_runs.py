"""``fedseg report`` on damaged run files: a clear error naming the file, or (a round
record cut off while appending) the run read without it; never a traceback, never a
damaged ``cases.csv`` used as is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.errors import ConfigError
from fedseg.reporting.stats import case_values


@pytest.fixture
def two(runs: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """Copies of two rows' runs (FedAvg, FedProx) that a test may damage."""
    return tuple(shutil.copytree(runs[k], tmp_path / k) for k in ("seed0", "mu_small"))


def _report(*dirs: Path):
    res = CliRunner().invoke(app, ["report", *map(str, dirs)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def _said(output: str, *parts: str) -> bool:
    """Whether every part is in ``output`` (the console wraps long lines anywhere)."""
    flat = "".join(output.split())
    return all("".join(part.split()) in flat for part in parts)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_a_garbage_round_record_is_an_error_naming_file_and_line(two):
    a, b = two
    lines = _lines(b / "rounds.jsonl")
    (b / "rounds.jsonl").write_text(lines[0] + "garbage{\n" + "".join(lines[1:]))
    res = _report(a, b)
    assert res.exit_code == 2  # an error, not a traceback
    assert _said(res.output, f"{b / 'rounds.jsonl'}:2: damaged round record")


def test_a_round_record_cut_off_at_the_end_is_skipped_as_resume_does(two, caplog):
    a, b = two
    text = (b / "rounds.jsonl").read_text()
    (b / "rounds.jsonl").write_text(text[:-40])  # a crash while appending the last round
    res = _report(a, b)
    assert res.exit_code == 0, res.output
    assert _said(res.output, "Paired tests against")
    assert "ignoring a damaged last line" in caplog.text


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[1, 2]\n", "expected a mapping of results, got list"),
        (
            '{"sites": {"A": [1]}, "average": {"dsc": {"r": 0.5}}}',
            "sites.A: expected {metric: {region",
        ),
        ('{"sites": {"A"', "unreadable results"),
        (
            '{"sites": {"A": {"hd95": {"r": 1}}}, "average": {"dsc": {"r": 0.5}}}',
            "sites.A: other metrics or regions than average",
        ),
    ],
)
def test_results_json_not_a_run_result_is_an_error_naming_it(two, content, says):
    a, b = two
    (b / "results.json").write_text(content)
    res = _report(a, b)
    assert res.exit_code == 2  # an error, not a traceback
    assert _said(res.output, f"{b / 'results.json'}: ", says)


def _damage_cases(path: Path, how: str) -> None:
    lines = _lines(path)
    if how == "abc":  # a value that is no number
        cells = lines[1].rstrip("\n").split(",")
        lines[1] = ",".join([*cells[:-1], "abc"]) + "\n"
        path.write_text("".join(lines))
    elif how == "cut value":  # the last value cut off mid-number
        path.write_text("".join(lines)[:-4])
    elif how == "cut line":  # cut at a line end, inside a case's values
        path.write_text("".join(lines[:-2]))
    elif how == "cut case":  # cut at a case's end: fewer cases than results.json counts
        site, case = lines[-1].split(",")[:2]
        path.write_text("".join(ln for ln in lines if ln.split(",")[:2] != [site, case]))


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("abc", ":2: value 'abc' is no number"),
        ("cut value", ": cut off (its last line has no line end)"),
        ("cut line", "lacks values the other cases have"),
        ("cut case", "test cases of site"),
    ],
)
def test_a_damaged_cases_csv_is_refused_naming_it(two, how, says):
    a, b = two
    _damage_cases(b / "cases.csv", how)
    with pytest.raises(ConfigError, match=r"cases\.csv"):
        case_values(b / "cases.csv", "dsc")
    res = _report(a, b)
    assert res.exit_code == 0, res.output  # the tables stand; the paired tests are refused
    assert _said(res.output, f"Paired tests not computed: {b / 'cases.csv'}", says)
    assert "Paired tests against" not in res.output


def test_the_undamaged_runs_give_paired_tests(two):
    res = _report(*two)
    assert res.exit_code == 0, res.output
    assert "Paired tests against" in res.output
    counted = json.loads((two[1] / "results.json").read_text())["cases"]
    assert sum(counted.values()) == len(case_values(two[1] / "cases.csv", "dsc"))
