import json
from pathlib import Path

import pytest
import torch

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError
from fedseg.metrics import METRICS
from fedseg.outputs import write_run_outputs
from fedseg.testing import synth_folder


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "fundus", "fundus", per_site=12)


def _cfg(root: Path, method: str = "fedavg", rounds: int = 3, **train):
    return parse_config(
        {
            "name": "t",
            "seed": 3,
            "data": {"root": str(root), "labels": "weak"},
            "method": {"name": method},
            "train": {"rounds": rounds, "local_iters": 2, "batch_size": 4, **train},
        }
    )


class Crash(Exception):
    pass


def test_run_writes_run_directory(fed_root, tmp_path):
    res = InProcessRunner(_cfg(fed_root), tmp_path / "run").run()
    run = tmp_path / "run"
    for name in ("config.yaml", "rounds.jsonl", "results.json", "cases.csv", "checkpoints/last.pt"):
        assert (run / name).is_file(), name
    assert not (run / "results.md").exists()  # tables are the caller's
    write_run_outputs(run, res)
    rounds = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk["method"] == "fedavg"
    assert set(on_disk["sites"]) == {"A", "B", "C"}
    assert set(on_disk["sites"]["A"]["dsc"]) == {"cup", "disc"}
    # RGB, 3 classes: 1,813,474 + 2 extra input channels x 16 x 3x3 + one more head class 16x3x3+1
    n = 1_813_474 + 2 * 16 * 9 + 16 * 9 + 1
    assert on_disk["params"] == {"total": n, "upload": n, "download": n}
    assert len(on_disk["timing"]["round_seconds"]) == 3 and on_disk["timing"]["eval_seconds"] > 0
    assert on_disk["average"]["dsc"]["cup"] == pytest.approx(
        sum(on_disk["sites"][s]["dsc"]["cup"] for s in "ABC") / 3
    )
    assert res["sites"] == on_disk["sites"]
    assert "| **Average**" in (run / "results.md").read_text()
    # every tensor that travelled is counted: FedAvg sends the whole state dict both ways
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)
    weights = ck["server"]["payloads"][0]["tensors"]
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    comm = on_disk["communication"]
    assert comm["upload_bytes_per_site_round"] == comm["download_bytes_per_site_round"] == nbytes
    assert comm["upload_bytes_total"] == 3 * 3 * nbytes
    assert len(ck["server"]["payloads"]) == 1  # one global payload stored once, not per site
    lines = (run / "cases.csv").read_text().splitlines()
    assert lines[0] == "site,case,id,region,metric,value"
    assert len(lines) == 1 + sum(on_disk["cases"].values()) * 2 * len(METRICS)  # 2 regions


@pytest.mark.parametrize("method", ["fedavg", "local"])
def test_resume_after_crash_gives_uninterrupted_results(fed_root, tmp_path, method):
    full = InProcessRunner(_cfg(fed_root, method), tmp_path / "full").run()

    def crash_after_round_1(record):
        if record["round"] == 1:
            raise Crash

    crashed = InProcessRunner(_cfg(fed_root, method), tmp_path / "crashed")
    with pytest.raises(Crash):
        crashed.run(on_round=crash_after_round_1)
    assert not (tmp_path / "crashed" / "results.json").exists()
    resumed = InProcessRunner(_cfg(fed_root, method), tmp_path / "crashed").run(resume=True)
    assert resumed["sites"] == full["sites"]
    rounds = (tmp_path / "crashed" / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in rounds] == [0, 1, 2]


def test_missing_data_and_missing_checkpoint_are_clear(fed_root, tmp_path):
    with pytest.raises(ConfigError, match=r"holds no manifest\.json"):
        InProcessRunner(_cfg(tmp_path / "nothing"), tmp_path / "r").run()
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        InProcessRunner(_cfg(fed_root), tmp_path / "never-ran").run(resume=True)


def test_synth_block_creates_data(tmp_path):
    cfg = parse_config(
        {
            "data": {
                "root": str(tmp_path / "d"),
                "labels": "weak",
                "synth": {"task": "fundus", "sites": 2, "size": 32, "per_site": 10},
            },
            "train": {"rounds": 1, "local_iters": 1, "batch_size": 2},
        }
    )
    res = InProcessRunner(cfg, tmp_path / "run").run()
    assert (tmp_path / "d" / "manifest.json").is_file()
    assert set(res["sites"]) == {"A", "B"}


def test_kill_while_writing_a_checkpoint_resumes_to_the_same_results(
    fed_root, tmp_path, monkeypatch
):
    """A crash after the old checkpoint was set aside but before the new one exists (the
    new one half-written in its temporary file)."""
    import os

    from fedseg.engine import rundir

    full = InProcessRunner(_cfg(fed_root), tmp_path / "full").run()
    real = rundir.atomic_write
    calls = {"n": 0}

    def dies_on_second_checkpoint(path, write, keep_old=None):
        if path.name == "last.pt":
            calls["n"] += 1
            if calls["n"] == 2:
                (path.parent / ".last.pt.killed").write_bytes(b"PK\x03\x04half")
                os.replace(path, keep_old)
                raise Crash
        return real(path, write, keep_old)

    monkeypatch.setattr(rundir, "atomic_write", dies_on_second_checkpoint)
    with pytest.raises(Crash):
        InProcessRunner(_cfg(fed_root), tmp_path / "crashed").run()
    monkeypatch.setattr(rundir, "atomic_write", real)
    assert not (tmp_path / "crashed/checkpoints/last.pt").exists()
    resumed = InProcessRunner(_cfg(fed_root), tmp_path / "crashed").run(resume=True)
    assert resumed["sites"] == full["sites"]
    assert not list((tmp_path / "crashed/checkpoints").glob(".last.pt.*"))
