"""``fedseg report``: rows per config with seeds pooled, labels, warnings, tasks, outputs."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
from matplotlib.image import imread
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.reporting.compare import build_report, comparison_table, report_csv, report_markdown
from fedseg.reporting.plots import plot_training_curves, val_dsc_history
from fedseg.reporting.runs import load_run

cli = CliRunner()


def _dsc(run: Path, site: str, region: str) -> float:
    return json.loads((run / "results.json").read_text())["sites"][site]["dsc"][region]


def _md_row(text: str, label: str) -> list[str]:
    """Cells of ``label``'s row in the first metric table (the DSC one)."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return next(c for c in cells if len(c) > 3)


def test_seeds_pool_into_mean_and_std(runs: dict[str, Path]) -> None:
    report = build_report([load_run(runs["seed0"]), load_run(runs["seed1"])])
    (section,) = report.sections
    (row,) = section.rows
    assert row.label == "fedavg" and row.seeds == [0, 1] and not section.warnings
    values = [_dsc(runs[k], "A", "polyp") for k in ("seed0", "seed1")]
    assert values[0] != values[1]  # the seeds trained differently
    mean, std = row.stat("dsc", "A", "polyp")
    assert mean == statistics.fmean(values) and std == statistics.stdev(values)
    cells = _md_row(report_markdown(report), "fedavg")
    assert cells[1] == "2 seeds (0, 1)"
    assert cells[2] == f"{100 * mean:.2f} ± {100 * std:.2f}"
    lines = list(csv.DictReader(io.StringIO(report_csv(report))))
    hit = [x for x in lines if (x["metric"], x["site"], x["region"]) == ("dsc", "A", "polyp")]
    assert len(hit) == 1 and float(hit[0]["mean"]) == mean and float(hit[0]["std"]) == std


def test_rows_named_by_distinguishing_settings_without_warning(runs: dict[str, Path]) -> None:
    report = build_report([load_run(runs[k]) for k in ("mu_small", "mu_large")])
    (section,) = report.sections
    assert [r.label for r in section.rows] == ["prox (method.mu=0.01)", "prox (method.mu=0.5)"]
    assert not section.warnings and not report.warnings  # only method settings differ
    text = report_markdown(report)
    assert (
        _md_row(text, "prox (method.mu=0.5)")[2]
        == f"{100 * _dsc(runs['mu_large'], 'A', 'polyp'):.2f}"
    )


def test_rows_of_different_methods_name_the_method_not_its_defaults(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    renamed = []
    for key in ("mu_small", "mu_large"):  # FedProx runs under FedAvg's config name
        copy = tmp_path / key
        shutil.copytree(runs[key], copy)
        cfg = copy / "config.yaml"
        cfg.write_text(re.sub(r"(?m)^name: .*$", "name: fedavg", cfg.read_text()))
        renamed.append(copy)
    fedavg = load_run(runs["seed0"])
    one = build_report([fedavg, load_run(renamed[0])]).sections[0]
    # mu is FedProx's own setting, not a difference between the two rows: the method is
    assert [r.label for r in one.rows] == [
        "fedavg (method.name=fedavg)",
        "fedavg (method.name=fedprox)",
    ]
    assert [list(r.settings) for r in one.rows] == [["method.name"], ["method.name"]]
    both = build_report([fedavg, *(load_run(r) for r in renamed)]).sections[0]
    assert [r.label for r in both.rows] == [
        "fedavg (method.name=fedavg)",
        "fedavg (method.mu=0.01, method.name=fedprox)",
        "fedavg (method.mu=0.5, method.name=fedprox)",
    ]


def test_a_setting_recorded_since_reads_as_its_default_in_older_runs(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Runs made before ``data.synth.seed`` was recorded pool with today's runs of seed 0."""
    import yaml

    dirs = []
    for key, synth in (("seed0", {"task": "polyp", "seed": 0}), ("seed1", {"task": "polyp"})):
        copy = tmp_path / key
        shutil.copytree(runs[key], copy)
        raw = yaml.safe_load((copy / "config.yaml").read_text())
        raw["data"]["synth"] = synth
        (copy / "config.yaml").write_text(yaml.safe_dump(raw))
        dirs.append(copy)
    (section,) = build_report([load_run(d) for d in dirs]).sections
    assert [r.label for r in section.rows] == ["fedavg"]
    assert len(section.rows[0].runs) == 2 and not section.warnings


def test_settings_added_since_a_run_was_made_read_as_their_defaults(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """A run made before a block or setting existed (here ``privacy`` and ``data.synth.split``)
    pools with today's runs at its defaults: no row split, no 'rows differ' warning."""
    import yaml

    old = tmp_path / "old"
    shutil.copytree(runs["seed1"], old)
    raw = yaml.safe_load((old / "config.yaml").read_text())
    raw.pop("privacy", None)
    raw["data"].get("synth", {}).pop("split", None)
    (old / "config.yaml").write_text(yaml.safe_dump(raw))
    (section,) = build_report([load_run(runs["seed0"]), load_run(old)]).sections
    assert [r.label for r in section.rows] == ["fedavg"] and not section.warnings


def test_warns_about_other_differences_and_splits_tasks(runs: dict[str, Path]) -> None:
    res = cli.invoke(app, ["report", *(str(runs[k]) for k in ("seed0", "longer", "other_task"))])
    assert res.exit_code == 0, res.output
    assert "rows differ in train.rounds" in res.output
    assert "2 different tasks" in res.output
    assert "## polyp: sites A, B" in res.output and "## fundus: sites A, B" in res.output
    report = build_report([load_run(runs[k]) for k in ("seed0", "longer", "other_task")])
    assert [s.task for s in report.sections] == ["polyp", "fundus"]
    assert [r.label for r in report.sections[0].rows] == ["fedavg", "long"]
    assert list(report.sections[1].regions) != list(report.sections[0].regions)


def test_out_dir_writes_markdown_csv_and_self_contained_html(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "rep"
    args = ["report", *(str(runs[k]) for k in ("seed0", "seed1", "longer")), "--out", str(out)]
    res = cli.invoke(app, args)
    assert res.exit_code == 0, res.output
    md = (out / "report.md").read_text()
    for link in re.findall(r"\]\(([^)]+)\)", md):  # figures and the runs' own files exist
        assert (out / link).is_file(), link
    assert "training_curves.png" in md and "learning curves" in md
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {r["row"] for r in rows} == {"fedavg", "long"}
    page = (out / "report.html").read_text()
    assert "<table" in page and "fedavg" in page and "2 seeds (0, 1)" in page
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) >= 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"<(link|script)\b", page) and "http" not in page
    for s in srcs:  # every inline image decodes to a non-blank picture
        png = base64.b64decode(s.split(",", 1)[1])
        img = imread(io.BytesIO(png))
        assert img.shape[0] > 100 and np.ptp(img[..., :3]) > 0.5


def test_every_run_has_training_curves(runs: dict[str, Path], tmp_path: Path) -> None:
    for run in runs.values():
        img = imread(run / "training_curves.png")[..., :3]
        coloured = (img.max(axis=-1) - img.min(axis=-1)) > 0.3  # the site lines (tab10)
        assert coloured.sum() > 200, run
    records = load_run(runs["longer"]).rounds
    assert val_dsc_history(records)  # evaluated every round: a second panel
    with_val = plot_training_curves(records, tmp_path / "a.png")
    without = [{k: v for k, v in r.items() if k != "eval"} for r in records]
    loss_only = plot_training_curves(without, tmp_path / "b.png")
    assert imread(with_val).shape[1] > 1.5 * imread(loss_only).shape[1]


def test_md_out_file_metrics_and_unfinished_run(runs: dict[str, Path], tmp_path: Path) -> None:
    res = cli.invoke(app, ["report", str(runs["seed0"]), "--out", str(tmp_path / "t.md")])
    assert res.exit_code == 0 and "### DSC (%)" in (tmp_path / "t.md").read_text()
    res = cli.invoke(app, ["report", str(runs["seed0"]), "--metric", "assd"])
    assert res.exit_code == 0 and "### ASSD" in res.output and "### DSC" not in res.output
    res = cli.invoke(app, ["report", str(runs["seed0"]), "--metric", "volume"])
    assert res.exit_code == 2 and "metrics ['volume'] are not in every run" in res.output
    res = cli.invoke(app, ["report", str(runs["seed0"]), str(tmp_path)])
    assert res.exit_code == 2 and "no results.json" in res.output
    res = cli.invoke(app, ["report", str(runs["seed0"]), str(runs["seed0"]) + "/"])
    assert res.exit_code == 2 and "given more than once" in res.output


def test_comparison_table_of_loaded_results(runs: dict[str, Path]) -> None:
    """The results-only entry point (used by the reproduce harness) pools seeds the same way
    and lists no run files for runs it has no directory of."""
    results = [json.loads((runs[k] / "results.json").read_text()) for k in ("seed0", "seed1")]
    text = comparison_table(results)
    mean, std = (
        build_report([load_run(runs["seed0"]), load_run(runs["seed1"])])
        .sections[0]
        .rows[0]
        .stat("dsc", "A", "polyp")
    )
    cell = f"{100 * mean:.2f} ± {100 * std:.2f}"
    assert _md_row(text, "fedavg")[:3] == ["fedavg", "2 seeds (0, 1)", cell]
    assert "Run files" not in text
