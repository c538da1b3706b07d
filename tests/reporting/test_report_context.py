"""Reports say how each row and run was trained, and mark distances of missed regions."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.reporting.compare import build_report, report_markdown
from fedseg.reporting.context import MISSED_MARK, MISSED_NOTE
from fedseg.reporting.html import report_html
from fedseg.reporting.runs import load_run


def _precision(run: Path) -> str:
    amp = load_run(run).results["precision"]["amp"]
    return {"off": "float32", "bf16": "bf16 autocast"}[amp]


def test_context_block_per_row_and_per_run(runs: dict[str, Path], tmp_path: Path) -> None:
    weak = tmp_path / "weak"
    shutil.copytree(runs["mu_small"], weak)  # the same run read as trained on weak labels
    cfg = yaml.safe_load((weak / "config.yaml").read_text())
    cfg["data"]["labels"] = "weak"
    (weak / "config.yaml").write_text(yaml.safe_dump(cfg))
    results = json.loads((weak / "results.json").read_text())
    (weak / "results.json").write_text(json.dumps({**results, "labels": "weak"}))
    manifest = yaml.safe_load((Path(cfg["data"]["root"]) / "manifest.json").read_text())
    kinds = ", ".join(f"{s['name']} {s['annotation']}" for s in manifest["sites"])
    report = build_report([load_run(d) for d in (runs["seed0"], runs["seed1"], weak)])
    md = report_markdown(report)
    html = report_html(report, None, {}, tmp_path)
    fp = _precision(runs["seed0"])
    row = f"2 rounds × 20 local steps; full labels; {fp}; 2 seeds (0, 1); distances in px"
    assert f"- fedavg: {row}" in md and row in html
    assert f"2 rounds × 20 local steps; weak labels ({kinds}); " in md
    one = f"2 rounds × 20 local steps; full labels; {fp}; seed 1; distances in px"
    assert f"  {one}" in md and one in html  # each run's own line under its files
    assert "Seeds 0" not in md and "| 0 |" not in md


def test_missed_regions_are_marked(runs: dict[str, Path], tmp_path: Path) -> None:
    """One round of 10 steps on fundus (32 px) finds nothing at the dark site B: its HD95 is
    the image diagonal there, and only there is it marked (a DSC of 0 with a prediction
    elsewhere in the image has a real HD95)."""
    trained = runs["other_task"]
    cfg = yaml.safe_load((trained / "config.yaml").read_text())
    short = tmp_path / "short"
    res = CliRunner().invoke(
        app,
        ["run", str(trained / "config.yaml"), "--out", str(short), "--set", "name=short",
         "--set", "train.rounds=1", "--set", "train.local_iters=10"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    manifest = json.loads((Path(cfg["data"]["root"]) / "manifest.json").read_text())
    diagonal = math.hypot(*manifest["spatial_shape"])  # pixel units: no spacing
    want = set()
    for run in (trained, short):
        with (run / "cases.csv").open() as f:
            for r in csv.DictReader(f):
                if r["metric"] == "hd95" and math.isclose(float(r["value"]), diagonal):
                    want.add((run.name, r["site"], r["region"]))
    assert any(w[0] == "short" for w in want)  # the short run missed a region somewhere
    md = report_markdown(build_report([load_run(trained), load_run(short)]))
    hd95 = md.split("### HD95")[1].split("###")[0]
    dsc = md.split("### DSC")[1].split("###")[0]
    assert MISSED_NOTE in hd95 and MISSED_MARK not in dsc
    head = next(line for line in hd95.splitlines() if line.startswith("| Method"))
    columns = [c.strip() for c in head.strip("|").split("|")]
    for line in hd95.splitlines():
        name = "short" if line.startswith("| short") else trained.name
        if not line.startswith(("| short", "| fedavg")):
            continue
        cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for site in ("A", "B"):
            for region in manifest["regions"]:
                mark = cells[f"{site} {region}"].endswith(MISSED_MARK)
                assert mark == ((name, site, region) in want), (line, want)
    assert "distances in px" in md
