"""docs/tutorial.md runs as written: its python and bash blocks, in order, in a fresh folder."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(TUTORIAL.read_text())


def test_the_tutorial_has_every_step() -> None:
    commands = "\n".join(code for lang, code in blocks() if lang == "bash")
    for step in ("data import-nifti", "data check", "data weak-labels", "run", "report"):
        assert f"fedseg {step} " in commands, step
    assert "fedseg predict " in commands and blocks()[0][0] == "python"


def test_every_command_of_the_tutorial_runs(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    for lang, code in blocks():
        cmd = (
            [sys.executable, "-c", code]
            if lang == "python"
            else ["bash", "-euo", "pipefail", "-c", code]
        )
        done = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{lang} block failed:\n{code}\n{done.stdout}\n{done.stderr}"

    sites = ["siteA", "siteB", "siteC"]
    assert sorted(p.stem for p in (tmp_path / "fed" / "preview").glob("*.png")) == sites
    # the report: one row per run, a column per site, an HTML page with the table and figures
    with (tmp_path / "report" / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    dsc = [r for r in rows if r["metric"] == "dsc"]
    assert len({r["row"] for r in dsc}) == 3 and {r["site"] for r in dsc} >= set(sites)
    assert all(0 <= float(r["mean"]) <= 1 for r in dsc if r["mean"])
    html = (tmp_path / "report" / "report.html").read_text()
    assert all(s in html for s in sites) and "<table" in html and "<img" in html
    # per-case scores for paired tests in every run
    for run in ("fedavg", "fedbn", "fedavg-weak"):
        assert (tmp_path / "runs" / run / "cases.csv").is_file()
    # the predicted mask overlays the new scan (same grid) and finds the organ
    scan = nib.load(tmp_path / "new" / "scan1.nii.gz")
    mask = nib.load(tmp_path / "masks" / "scan1.nii.gz")
    assert mask.shape == scan.shape and np.allclose(mask.affine, scan.affine)
    predicted = np.asarray(mask.dataobj) == 1
    x, y, z = np.indices(scan.shape)
    organ = ((x - 20) ** 2 + (y - 20) ** 2 <= 49) & (z >= 2) & (z < 10)
    dice = 2 * (predicted & organ).sum() / (predicted.sum() + organ.sum())
    assert dice > 0.5, dice
