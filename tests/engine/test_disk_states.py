"""``engine.site_states: disk``: private states on disk, results identical to memory."""

from pathlib import Path

import pytest
import torch

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import DataError
from fedseg.inference import RunModels
from fedseg.testing import synth_folder


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "fundus", "fundus", per_site=10)


def _cfg(root: Path, states: str, **engine):
    return parse_config(
        {
            "name": "t",
            "seed": 1,
            "data": {"root": str(root), "labels": "weak"},
            "method": {"name": "fedlppa"},
            "train": {"rounds": 3, "local_iters": 2, "batch_size": 4},
            "eval": {"save_models": False},
            "engine": {"device": "cpu", "threads": 1, "site_states": states, **engine},
        }
    )


@pytest.fixture(scope="module")
def in_memory(fed_root, tmp_path_factory) -> tuple[dict, Path]:
    run = tmp_path_factory.mktemp("mem") / "r"
    return InProcessRunner(_cfg(fed_root, "memory"), run).run(), run


class Crash(Exception):
    pass


def _crash_after(root: Path, run: Path, rounds: int) -> Path:
    """A disk-state run into ``run`` that crashes after round ``rounds`` (1-based)."""

    def crash(record):
        if record["round"] == rounds - 1:
            raise Crash

    with pytest.raises(Crash):
        InProcessRunner(_cfg(root, "disk"), run).run(on_round=crash)
    return run


def test_disk_states_give_the_results_of_memory_and_stay_out_of_the_checkpoint(
    fed_root, tmp_path, in_memory
):
    run = tmp_path / "disk"
    res = InProcessRunner(_cfg(fed_root, "disk"), run).run()
    assert res["sites"] == in_memory[0]["sites"]
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ck["sites"] == {name: {"on_disk": 2} for name in ("A", "B", "C")}
    folders = list((run / "sites" / "A").iterdir())  # one folder per run id
    assert len(folders) == 1
    files = sorted(p.name for p in folders[0].iterdir())
    # the state before round 1 and the newest checkpoint_every + 1 = 2 rounds
    assert files == ["initial.pt", "round-00001.pt", "round-00002.pt"]
    state = torch.load(folders[0] / "round-00002.pt", weights_only=True)
    assert set(state["method"]) >= {"decoders", "la"}
    # the site models are rebuilt from the files (export, predict), equal to memory's
    written = {p.name: p.stat().st_mtime_ns for p in folders[0].iterdir()}
    disk_model = RunModels(run).site_model("A").model.state_dict()
    memory_model = RunModels(in_memory[1]).site_model("A").model.state_dict()
    assert all(torch.equal(v, memory_model[k]) for k, v in disk_model.items())
    assert {p.name: p.stat().st_mtime_ns for p in folders[0].iterdir()} == written  # only read


def test_a_crash_resumes_from_the_files_to_the_same_results(fed_root, tmp_path, in_memory):
    run = _crash_after(fed_root, tmp_path / "crashed", 2)
    resumed = InProcessRunner(_cfg(fed_root, "disk"), run).run(resume=True)
    assert resumed["sites"] == in_memory[0]["sites"]


def test_a_missing_state_file_is_named_on_resume(fed_root, tmp_path):
    run = _crash_after(fed_root, tmp_path / "crashed", 1)
    (folder,) = (run / "sites" / "B").iterdir()
    (folder / "round-00000.pt").unlink()
    with pytest.raises(DataError, match=r"round-00000\.pt: site 'B'"):
        InProcessRunner(_cfg(fed_root, "disk"), run).run(resume=True)


def test_worker_processes_read_and_write_the_files(fed_root, tmp_path, in_memory):
    """With ``workers: 2`` the worker processes keep the states in the site folders;
    the results stay those of the sequential engine with states in memory."""
    run = tmp_path / "parallel"
    res = InProcessRunner(_cfg(fed_root, "disk", workers=2), run).run()
    assert res["sites"] == in_memory[0]["sites"]
    for site in ("A", "B", "C"):
        (folder,) = (run / "sites" / site).iterdir()
        assert sorted(p.name for p in folder.iterdir()) == [
            "initial.pt",
            "round-00001.pt",
            "round-00002.pt",
        ]
