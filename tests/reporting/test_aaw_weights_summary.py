"""benchmarks/aaw_weights.py: the AAW weight summary the pancreas notes quote."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "aaw_weights.py"


@pytest.fixture()
def aaw():
    spec = importlib.util.spec_from_file_location("aaw_weights", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, rounds: list[dict]) -> Path:
    lines = [json.dumps({"round": i, "server": s}) for i, s in enumerate(rounds)]
    (tmp_path / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_second_half_blocks_and_effective_sites(tmp_path, aaw, capsys):
    first = {"aaw_weights": {"A": 0.5, "B": 0.5}, "aaw_gaps": {}, "aaw_step": None}  # round 0
    spread = {"aaw_weights": {"A": 0.5, "B": 0.5}, "aaw_gaps": {"A": 0.1, "B": 0.1}}
    one = {"aaw_weights": {"A": 1.0, "B": 0.0}, "aaw_gaps": {"A": 0.3, "B": -0.1}}
    run = _run(tmp_path, [first, spread, spread, one, one])
    assert [r["r"] for r in aaw.server_rounds(run)] == [1, 2, 3, 4]  # round 0 has no gaps
    assert aaw.effective_sites({"A": 0.5, "B": 0.5}) == pytest.approx(2.0)
    aaw.main([str(run), "--block", "2"])
    out = capsys.readouterr().out
    assert "| A | 1.000 | 0 / 2 | +0.300 |" in out  # rounds 3-4 are the second half
    assert "| B | 0.000 | 2 / 2 | -0.100 |" in out
    assert "| 1-2 | +0.100 | +0.100 | 0.50 | 0.50 | 2.0 |" in out
    assert "| 3-4 | +0.300 | -0.100 | 1.00 | 0.00 | 1.0 |" in out


def test_a_run_without_aaw_is_refused_by_name(tmp_path, aaw):
    run = _run(tmp_path, [{"aaw_weights": {"A": 1.0}, "aaw_gaps": {}}, {}])
    with pytest.raises(SystemExit, match=r"rounds\.jsonl: no round records aaw_gaps"):
        aaw.main([str(run)])
    with pytest.raises(SystemExit, match=r"no rounds\.jsonl"):
        aaw.main([str(tmp_path / "missing")])
