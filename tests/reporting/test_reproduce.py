"""``fedseg reproduce``: paper tables at the smoke budget on a tiny federation, the shipped
tables' configs, budgets and published numbers."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import parse_config
from fedseg.reproduce.harness import BUDGETS, apply_budget, budget_overrides, row_config
from fedseg.reproduce.papers import list_papers, load_paper

TINY = ["data.synth.sites=2", "model.widths=[8,16,32]", "model.dropout=[0,0,0]"]


def _invoke(args: list[str]):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res


def _dsc(run_dir) -> float:
    avg = json.loads((run_dir / "results.json").read_text())["average"]["dsc"]
    return 100 * statistics.fmean(avg.values())


def test_reproduce_two_rows_smoke_beside_published(tmp_path):
    out = tmp_path / "t7"
    args = ["reproduce", "fedlppa", "table7", "--budget", "smoke", "--out", str(out)]
    args += ["--row", "1", "--row", "tdf", "--set", f"data.root={tmp_path / 'faz'}"]
    for s in TINY:
        args += ["--set", s]
    res = _invoke(args)
    table = (out / "table.md").read_text()
    assert "baseline (FedAvg)" in table and "| TDF |" in table
    assert not (out / "tdf-pd").exists()  # rows not asked for are not run
    assert "**not run** (no runs of TDF + PD)" in table  # and their claims say so
    # a smoke run proves only that the rows run: its claims get no holds/contradicted
    claims = table.split("### Claims")[1].split("\n### ")[0]
    assert "smoke: not evidence" in claims and "smoke: not evidence" in res.output
    assert not any(f"**{v}**" in claims for v in ("holds", "contradicted", "unresolved"))
    # the paper's FAZ numbers sit beside ours (Table VII: 84.05 / 14.18 and 90.61 / 7.14)
    assert "84.05 | 14.18" in table and "90.61 | 7.14" in table
    assert "Lin et al., IEEE TMI 2024, Sec. IV-D1, Table VII" in table and "Budget `smoke`" in table
    assert all(item in table for item in TINY)  # the --set items are stated with the budget
    for label in ("baseline-fedavg", "tdf"):
        run_dir = out / label / "seed0"
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert cfg["train"]["rounds"] == 2 and cfg["train"]["local_iters"] == 4
        assert cfg["data"]["synth"]["size"] == 32 and cfg["data"]["synth"]["sites"] == 2
        assert cfg["data"]["root"].endswith("faz-smoke")
        assert f"{_dsc(run_dir):.2f}" in table  # our cell is the run's average DSC
    assert cfg["method"]["tdf"] is True
    rows = [r for r in csv.DictReader((out / "table.csv").open()) if r["metric"] == "dsc"]
    assert [r["row"] for r in rows if not r["vs"]] == ["baseline (FedAvg)", "TDF"]
    assert float(rows[-1]["paper"]) == 90.61 and rows[-1]["vs"] == "baseline (FedAvg)"
    assert int(rows[-1]["pairs"]) > 0 and rows[-1]["verdict"] in ("better", "worse", "unresolved")
    assert "| DSC (%) | 95 % CI |" in res.output
    # a second call reuses the finished runs (identical configs): nothing is retrained
    stamp = (out / "tdf" / "seed0" / "results.json").stat().st_mtime_ns
    _invoke(args)
    assert (out / "tdf" / "seed0" / "results.json").stat().st_mtime_ns == stamp


def test_seeds_give_mean_and_std(tmp_path):
    out = tmp_path / "t"
    args = ["reproduce", "vc", "table2", "--out", str(out), "--seeds", "2", "--row", "none"]
    args += ["--set", f"data.root={tmp_path / 'rif'}", "--set", "data.synth.site_weights=null"]
    for s in TINY:
        args += ["--set", s]
    _invoke(args)
    assert {p.name for p in (out / "none").iterdir()} == {"seed0", "seed1"}
    values = [
        100
        * statistics.fmean(
            json.loads((out / "none" / s / "results.json").read_text())["average"][
                "jaccard"
            ].values()
        )
        for s in ("seed0", "seed1")
    ]
    table = (out / "table.md").read_text()
    expected = f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"
    assert expected in table and "72.39 | 30.14" in table


@pytest.mark.parametrize("paper", list_papers())
def test_every_row_of_every_table_is_a_valid_run(paper):
    p = load_paper(paper)
    assert p.tables
    for t in p.tables.values():
        for row in t.rows:
            for budget in ("smoke", "cpu", "paper"):
                raw, _ = row_config(row, budget, budget_overrides(budget, p), [])
                cfg = parse_config(raw)
                if budget == "smoke":
                    assert cfg.train.rounds == 2 and cfg.train.local_epochs is None
                    assert cfg.data.synth is None or cfg.data.synth.size == 32


def test_published_numbers_match_the_papers():
    t7 = load_paper("fedlppa").table("table7")
    assert t7.rows[-1].published[2:4] == (93.51, 5.30)
    pan = load_paper("pancreas3d").table("table2-t1")
    assert pan.rows[2].label == "FedAvg+AAW" and pan.rows[2].published[0] == 0.7017
    # the paper's six metrics per modality: T1 HD95 and T2 recall of FedAvg+AAW
    assert pan.rows[2].published[4] == 6.3298 and pan.rows[2].published[9] == 0.6727
    assert load_paper("fedbcs").table("table1-prostate").rows[-1].published == (82.60,)


def test_list_and_bad_names(tmp_path):
    res = _invoke(["reproduce", "--list"])
    for paper in ("fedlppa", "pancreas3d", "fedbcs", "vc"):
        assert paper in res.output
    assert "table8" in res.output and "tau-nuclei" in res.output
    bad = CliRunner().invoke(app, ["reproduce", "fedlppa", "table99", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "table7" in bad.output
    bad = CliRunner().invoke(app, ["reproduce", "nope", "table1"])
    assert bad.exit_code != 0 and "fedlppa" in bad.output
    bad = CliRunner().invoke(app, ["reproduce", "vc", "table2", "--budget", "huge"])
    assert bad.exit_code != 0 and "smoke" in bad.output


def test_budget_renames_synthetic_root_only():
    raw = {"data": {"root": "data/x", "synth": {"task": "faz"}}, "train": {"local_epochs": 1}}
    out = apply_budget(raw, "smoke", BUDGETS["smoke"])
    assert out["data"]["root"] == "data/x-smoke" and "local_epochs" not in out["train"]
    real = apply_budget({"data": {"root": "data/real"}}, "smoke", BUDGETS["smoke"])
    assert real["data"] == {"root": "data/real"} and real["train"]["rounds"] == 2
    assert apply_budget(raw, "cpu", BUDGETS["cpu"]) == raw
