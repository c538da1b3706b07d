"""The parity table (benchmarks/parity/table.py): arms read at one budget, paired per case,
a verdict only with three seeds on both sides."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "parity" / "table.py"


@pytest.fixture()
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("parity_table", TABLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "EVIDENCE", tmp_path)
    monkeypatch.setattr(
        module,
        "TABLES",
        {"t": {"M": {"authors": "a", "fedseg authors": "v", "fedseg paper": "f"}}},
    )
    monkeypatch.setattr(module, "BUDGETS", {"t": {"rounds": 4, "batch_size": 10}})
    monkeypatch.setattr(module, "CONTRASTS", {"t": [("M", "fedseg paper", "fedseg authors")]})
    return module


def _run(folder: Path, values: np.ndarray, batch: int = 10, best: bool = False) -> None:
    for where in [folder, folder / "best_round"] if best else [folder]:
        where.mkdir(parents=True)
        lines = ["site,case,id,region,metric,value"]
        lines += [f"A,{i},c{i},faz,dsc,{float(v)!r}" for i, v in enumerate(values)]
        (where / "cases.csv").write_text("\n".join(lines) + "\n")
        avg = {"dsc": {"faz": float(values.mean())}}
        (where / "results.json").write_text(json.dumps({"sites": {"A": avg}, "average": avg}))
    (folder / "config.yaml").write_text(
        yaml.safe_dump({"train": {"rounds": 4, "batch_size": batch}})
    )


def _row(lines: list[str], arm: str) -> list[str]:
    return next(
        [c.strip() for c in line.split("|")[1:-1]] for line in lines if f"| {arm} |" in line
    )


def test_runs_of_another_budget_are_left_out_and_verdicts_wait_for_three_seeds(table, tmp_path):
    base = np.random.default_rng(0).uniform(0.6, 0.9, 30)
    for s in range(3):
        _run(tmp_path / "a" / f"seed{s}", base + 0.004 * s, best=True)
        _run(tmp_path / "v" / f"seed{s}", base + 0.004 * s + 0.001)
    _run(tmp_path / "f" / "seed0", base - 0.1)
    _run(tmp_path / "f" / "seed1", base, batch=8)  # an older budget: not read
    lines = table.rows("t")

    authors = _row(lines, "authors")
    assert authors[2].endswith("(3)") and authors[3].endswith("(3)")  # its pick beside
    variant = _row(lines, "fedseg authors")
    assert variant[4].startswith("+0.1") and variant[6] == "equivalent"
    default = _row(lines, "fedseg paper")
    assert default[2].endswith("(1)")  # the batch-8 run is left out
    assert default[4].startswith("-10.0") and default[6] == "pending (1 of 3 seeds)"
    last = [c.strip() for c in lines[-1].split("|")[1:-1]]
    assert last[:3] == ["M", "fedseg paper", "fedseg authors"]
    assert last[3].startswith("-10.1") and last[5].startswith("pending")


def _three_and_one(tmp_path: Path, seed: int) -> None:
    """The authors' and the variant's arms with three seeds, the default's with one."""
    base = np.random.default_rng(seed).uniform(0.6, 0.9, 30)
    for s in range(3):
        _run(tmp_path / "a" / f"seed{s}", base + 0.004 * s)
        _run(tmp_path / "v" / f"seed{s}", base + 0.004 * s + 0.001)
    _run(tmp_path / "f" / "seed0", base - 0.1)


def test_a_one_seed_diagnostic_arm_shows_its_difference_without_a_verdict(
    table, tmp_path, monkeypatch
):
    _three_and_one(tmp_path, 1)
    monkeypatch.setattr(table, "NO_VERDICT", {"t": {"fedseg paper": "diagnostic"}})
    lines = table.rows("t")
    default = _row(lines, "fedseg paper")
    assert default[4].startswith("-10.0") and default[6] == "diagnostic (1 seed, no verdict)"
    assert _row(lines, "fedseg authors")[6] == "equivalent"  # three seeds: a verdict
    last = [c.strip() for c in lines[-1].split("|")[1:-1]]
    assert last[5] == "diagnostic (1 seed, no verdict)"


def test_a_stopped_arm_says_why_and_an_arm_with_three_seeds_keeps_its_verdict(
    table, tmp_path, monkeypatch
):
    _three_and_one(tmp_path, 2)
    reasons = {"fedseg paper": "stopped: its network superseded", "fedseg authors": "diagnostic"}
    monkeypatch.setattr(table, "NO_VERDICT", {"t": reasons})
    lines = table.rows("t")
    assert _row(lines, "fedseg paper")[6] == "stopped (1 seed, no verdict; its network superseded)"
    assert _row(lines, "fedseg authors")[6] == "equivalent"
