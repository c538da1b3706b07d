"""Damaged runs, changed configs on resume, occupied run directories and unsafe files: each is
refused with one line naming the file or field (exit 2, no traceback), and nothing finished
is lost."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.errors import DataError

ROUNDS = 3


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    root = tmp_path_factory.mktemp("fed") / "fundus"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    generate_weak_labels(root, seed=0)
    return root


def _config(fed: Path, tmp: Path, **train: object) -> Path:
    raw = {
        "name": "bad",
        "seed": 1,
        "data": {"root": str(fed), "labels": "weak"},
        "train": {"rounds": ROUNDS, "local_iters": 1, "batch_size": 4, "augment": False, **train},
        "engine": {"device": "cpu"},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _cli(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app, list(args))
    text = out.output + (str(out.exception) if out.exception and out.exit_code != 2 else "")
    assert "Traceback" not in text, text
    return out.exit_code, text


def _run(fed: Path, tmp: Path, out: Path, *extra: str) -> tuple[int, str]:
    return _cli("run", str(_config(fed, tmp)), "--out", str(out), *extra)


@pytest.fixture(scope="module")
def finished(fed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("finished")
    code, text = _run(fed, tmp, tmp / "run")
    assert code == 0, text
    return tmp / "run"


def _copy(run: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(run, dest)
    return dest


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.lr=0.5", "train.lr"),
        ("seed=9", "seed"),
        ("train.local_iters=4", "train.local_iters"),
        ("data.labels=full", "data.labels"),
        ("data.sites=[A]", "data.sites"),
        ("method.name=fedlppa", "method.name"),
        ("train.rounds=2", "train.rounds"),
    ],
)
def test_resume_with_a_changed_config_is_refused(finished, tmp_path, override, key):
    run = _copy(finished, tmp_path / "run")
    before = (run / "config.yaml").read_text()
    code, text = _cli("run", "--resume", str(run), "--set", override)
    assert code == 2 and "cannot resume with a changed config" in text and key in text
    assert (run / "config.yaml").read_text() == before


def test_resume_with_more_rounds_continues_and_records_the_change(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 0, text
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["rounds"] == ROUNDS + 1
    change = json.loads((run / "resumes.jsonl").read_text())
    assert change == {"after_round": ROUNDS - 1, "changes": {"train.rounds": [ROUNDS, ROUNDS + 1]}}
    assert [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()] == [
        0, 1, 2, 3
    ]  # fmt: skip


def test_a_run_that_recorded_only_the_method_settings_given_still_resumes(finished, tmp_path):
    """config.yaml of runs started before 2026-11-28 holds only the method settings given;
    the defaults the run resolves today are not a change of its config."""
    run = _copy(finished, tmp_path / "run")
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert set(stored["method"]) > {"name"}  # recorded today: every setting
    stored["method"] = {"name": stored["method"]["name"]}
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 0, text
    change = json.loads((run / "resumes.jsonl").read_text())
    assert change["changes"] == {"train.rounds": [ROUNDS, ROUNDS + 1]}


def test_a_setting_added_since_the_run_began_resumes_at_its_default(finished, tmp_path):
    """A key the stored config lacks (a setting fedseg gained after the run began, here
    ``train.rotation``, default right_angles) is its default, not a change; set otherwise,
    refused."""
    run = _copy(finished, tmp_path / "run")
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["train"].pop("rotation") == "right_angles"
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    code, text = _cli("run", "--resume", str(run), "--set", "train.rotation=paper_45")
    assert code == 2 and "train.rotation 'right_angles' -> 'paper_45'" in text
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 0, text
    change = json.loads((run / "resumes.jsonl").read_text())
    assert change["changes"] == {"train.rounds": [ROUNDS, ROUNDS + 1]}


def test_out_into_a_finished_run_is_refused_without_overwrite(finished, fed, tmp_path):
    run = _copy(finished, tmp_path / "run")
    rounds = (run / "rounds.jsonl").read_text()
    code, text = _run(fed, tmp_path, run)
    assert code == 2 and "is not empty" in text and "--overwrite" in text
    assert (run / "rounds.jsonl").read_text() == rounds
    code, text = _run(fed, tmp_path, run, "--overwrite")
    assert code == 0, text
    assert len((run / "rounds.jsonl").read_text().splitlines()) == ROUNDS
    assert not (run / "resumes.jsonl").exists()


def test_overwrite_never_deletes_a_folder_that_is_no_run(fed, tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("...")
    code, text = _run(fed, tmp_path, precious, "--overwrite")
    assert code == 2 and "no fedseg run directory" in text
    assert (precious / "chapter1.tex").exists()


def test_a_run_directory_in_use_by_another_process_is_refused(fed, tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from fedseg.engine.rundir import RunDir\n"
         f"with RunDir({str(run)!r}).lock():\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, text = _run(fed, tmp_path, run)
        assert code == 2 and "another fedseg process is writing this run directory" in text
    finally:
        holder.kill()
        holder.wait()


def test_damaged_last_round_line_is_skipped_on_resume(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    lines = (run / "rounds.jsonl").read_text().splitlines()
    (run / "rounds.jsonl").write_text("\n".join(lines) + '\n{"round": 3, "parti')
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 0, text
    rounds = [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]


def test_damaged_round_line_in_the_middle_names_file_and_line(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    lines = (run / "rounds.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 2 and "rounds.jsonl:2: damaged round record" in text


def test_truncated_checkpoint_falls_back_to_the_previous_one(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    last = run / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    (run / "checkpoints" / ".last.pt.abc123").write_bytes(b"partial")  # a killed write
    code, text = _cli("run", "--resume", str(run), "--set", f"train.rounds={ROUNDS + 1}")
    assert code == 0, text
    assert not list((run / "checkpoints").glob(".last.pt.*"))  # cleaned up
    rounds = [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]  # round 3 (index 2) was redone from the previous checkpoint


def test_no_usable_checkpoint_is_a_clear_error(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    for name in ("last.pt", "previous.pt"):
        (run / "checkpoints" / name).write_bytes(b"\x00" * 10)
    code, text = _cli("run", "--resume", str(run))
    assert code == 2 and "no usable checkpoint" in text and "last.pt" in text


class _Evil:
    def __reduce__(self):  # what a crafted checkpoint would do when unpickled
        return (os.system, (f"touch {_MARKER}",))


_MARKER = Path("/tmp/fedseg-crafted-pickle-ran")


def test_a_crafted_pickle_is_never_executed(finished, tmp_path):
    import torch

    _MARKER.unlink(missing_ok=True)
    run = _copy(finished, tmp_path / "run")
    for name in ("last.pt", "previous.pt"):
        torch.save({"round": 1, "evil": _Evil()}, run / "checkpoints" / name)
    code, text = _cli("run", "--resume", str(run))
    assert code == 2 and "no usable checkpoint" in text
    assert not _MARKER.exists()
    site_state = tmp_path / "state.pt"
    with site_state.open("wb") as fh:
        pickle.dump({"evil": _Evil()}, fh)
    from fedseg.engine.site_state import SiteStateStore

    store = SiteStateStore(tmp_path / "store")
    store.root.mkdir()
    (store.root / "round-00000.pt").write_bytes(site_state.read_bytes())
    with pytest.raises(DataError, match=r"round-00000\.pt: cannot read this site's saved state"):
        store.latest_before(1)
    assert not _MARKER.exists()


def test_results_are_readable_by_colleagues(finished):
    umask = os.umask(0)
    os.umask(umask)
    for name in ("results.json", "config.yaml", "results.md", "cases.csv"):
        mode = stat.S_IMODE((finished / name).stat().st_mode)
        assert mode == 0o666 & ~umask, (name, oct(mode))


def test_resume_of_a_folder_that_holds_no_run(tmp_path):
    code, text = _cli("run", "--resume", str(tmp_path / "nothing"))
    assert code == 2 and "no fedseg run there" in text


@pytest.mark.parametrize(
    "synth",
    [
        {"task": "fundus", "sites": 3, "size": 32},  # one site more than the folder
        {"task": "fundus", "sites": 2, "size": 48},  # another image size
        {"task": "polyp", "sites": 2, "size": 32},  # another task
        {"task": "fundus", "sites": 2, "size": 32, "names": "paper"},  # fundus names no sites
        {"task": "fundus", "sites": 2, "size": 32, "style_shift": 0.5},  # made at shift 1
    ],
)
def test_existing_data_root_that_data_synth_does_not_describe(fed, tmp_path, synth):
    path = _config(fed, tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["data"]["synth"] = synth
    path.write_text(yaml.safe_dump(raw))
    code, text = _cli("run", str(path), "--out", str(tmp_path / "run"))
    assert code == 2, text
    assert f"data.root {fed}" in text or "--names paper" in text, text
    assert not (tmp_path / "run" / "rounds.jsonl").exists()


def _unusable_cuda() -> str:
    import torch

    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("where", ["config", "--set"])
def test_a_cuda_device_this_torch_cannot_use(fed, tmp_path, where):
    device = _unusable_cuda()
    path = _config(fed, tmp_path)
    extra: tuple[str, ...] = ("--set", f"engine.device={device}")
    if where == "config":
        raw = yaml.safe_load(path.read_text())
        raw["engine"]["device"] = device
        path.write_text(yaml.safe_dump(raw))
        extra = ()
    code, text = _cli("run", str(path), "--out", str(tmp_path / "run"), *extra)
    assert code == 2 and f"engine.device: {device!r} requested but this " in text, text
    assert len(text.strip().splitlines()) == 1 and not (tmp_path / "run/results.json").exists()


def test_predict_on_a_damaged_volume_says_it_cannot_be_read(finished, tmp_path):
    import gzip

    import nibabel as nib
    import numpy as np

    good = tmp_path / "good.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8), np.float32), np.eye(4)), good)
    inputs = tmp_path / "in"
    inputs.mkdir()
    damaged = inputs / "scan.nii.gz"
    damaged.write_bytes(gzip.compress(gzip.decompress(good.read_bytes())[:200]))  # cut short
    args = ("predict", str(finished), "--site", "A", "--input", str(inputs))
    code, text = _cli(*args, "--out", str(tmp_path / "out"))
    assert code == 2 and f"{damaged}: damaged or unreadable as a NIfTI volume" in text, text
    assert "channel" not in text
