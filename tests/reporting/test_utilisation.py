"""The report shows fedvc's virtual-row utilisation per class (issue 25)."""

from __future__ import annotations

from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.reporting.html import write_report
from fedseg.reporting.runs import load_run
from fedseg.reporting.utilisation import utilisation_rows


def test_report_tables_the_virtual_row_utilisation(tmp_path):
    args = ["run", "vc/table2_vc_only", "--out", str(tmp_path / "vc")]
    for s in (
        "data.synth.size=32",
        "data.synth.sites=2",
        "data.synth.site_weights=null",
        f"data.root={tmp_path / 'rif'}",
        "train.rounds=3",
        "train.local_epochs=null",
        "train.local_iters=2",
        "train.batch_size=2",
        "model.widths=[8,16,32]",
        "model.dropout=[0,0,0]",
    ):
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    run = load_run(tmp_path / "vc")
    rows = utilisation_rows(run.rounds)
    classes = {rnd: [r[1] for r in rows if r[0] == rnd] for rnd in ("1", "2", "3")}
    assert classes["1"] == classes["2"] == classes["3"] and {"1", "2"} <= set(classes["3"])
    last = next(r for r in run.rounds if r["round"] == 2)["clients"]
    mean_rows = sum(c["vc_rows_c1"] for c in last.values()) / len(last)
    assert ("3", "1", f"{mean_rows:.2f}") == next(r for r in rows if r[:2] == ("3", "1"))[:3]
    write_report([tmp_path / "vc"], tmp_path / "rep")
    assert "Virtual-row utilisation" in (tmp_path / "rep" / "report.md").read_text()
    assert "<th>rows used</th>" in (tmp_path / "rep" / "report.html").read_text()
