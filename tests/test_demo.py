"""``fedseg demo`` (what ``scripts/demo.sh`` runs) at a smaller size: the three methods on one
federation, the side-by-side tables with each run's own numbers, report.html, next steps
that work."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.demo import METHODS

SMALL = [
    "train.rounds=1",
    "train.local_iters=2",
    "train.batch_size=2",
    "data.synth.size=32",
    "data.synth.per_site=12",
]


def _cli(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_demo_compares_three_methods_and_says_what_next(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    text = _cli("demo", "--out", str(out), *(a for s in SMALL for a in ("--set", s)))
    assert "fedseg demo: 4 synthetic faz sites" in text and "1 rounds x 2 local" in text
    for k, label in enumerate(METHODS.values(), start=1):
        assert f"[{k}/3] {label}: " in text
    tables = re.findall(r"DSC \(%\) of (\w+), test cases", text)
    assert tables == ["faz"]
    annotations = [
        s["annotation"] for s in json.loads((out / "data/manifest.json").read_text())["sites"]
    ]
    assert len(set(annotations)) > 1 and all(a in text for a in annotations)
    for method, label in METHODS.items():  # each row shows that run's own averages
        average = json.loads((out / method / "results.json").read_text())["average"]["dsc"]
        rows = [ln for ln in text.splitlines() if ln.startswith(f"│ {label} ")]
        assert len(rows) == 1, rows
        for row, region in zip(rows, ("faz",), strict=True):
            assert row.split("│")[-2].strip() == f"{100 * average[region]:.2f}"
    html = out / "report" / "report.html"
    assert f"report (tables, learning curves, segmentations): {html}" in text
    page = html.read_text()
    assert all(m in page for m in METHODS) and "segmentations of the test cases" in page
    after = text.split("\nnext:\n")[1].splitlines()
    commands = [ln.strip() for ln in after if ln.strip().startswith("fedseg ")]
    run, report = (shlex.split(c)[1:] for c in commands[:2])
    assert run[0] == "run" and report[0] == "report"
    _cli(*run)  # the next steps work as printed
    _cli(*report)
    assert "fedprox" in (out / "report" / "report.md").read_text()
