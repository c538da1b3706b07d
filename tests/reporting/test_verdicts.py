"""Statistics of a reproduced table: paired tests over cases, Holm, verdicts per claim,
refusals, the evidence folder and the evidence budget's rule."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import os
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from fedseg.errors import ConfigError
from fedseg.reporting.stats import holm, paired
from fedseg.reproduce import papers, protocol
from fedseg.reproduce.budget import Attempt, gain, next_rounds
from fedseg.reproduce.evidence import render_markdown, write_index
from fedseg.reproduce.harness import reproduce
from fedseg.reproduce.papers import Claim, PaperRow, PaperTable
from fedseg.reproduce.verdicts import RowRuns, analyse

CASES = [(site, f"{site}{i}") for site in ("A", "B") for i in range(8)]
CONFIG = {
    "seed": 0,
    "data": {"root": "data/x", "synth": {"task": "faz", "size": 32}},
    "train": {"rounds": 5, "local_iters": 3},
    "eval": {"split": "test"},
}


def _cases(path: Path, dsc: dict[tuple[str, str], float]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["site", "case", "id", "region", "metric", "value"])
        for i, ((site, cid), v) in enumerate(dsc.items()):
            for region, shift in (("faz", 0.0), ("rim", 0.02)):
                w.writerow([site, i, cid, region, "dsc", v + shift])
    return path


def _row(tmp_path: Path, label: str, values: list[list[float]], **changes) -> RowRuns:
    """A row with one run per list in ``values`` (per-case DSC as fractions)."""
    rr = RowRuns(label)
    for seed, vals in enumerate(values):
        cfg = json.loads(json.dumps(CONFIG))
        cfg["seed"] = seed
        for dotted, v in changes.items():
            node = cfg
            *parents, leaf = dotted.split("__")
            for p in parents:
                node = node[p]
            node[leaf] = v
        rr.configs.append(cfg)
        rr.results.append({"average": {"dsc": {"faz": sum(vals) / len(vals), "rim": 0.0}}})
        rr.cases.append(
            _cases(tmp_path / f"{label}-{seed}.csv", dict(zip(CASES, vals, strict=True)))
        )
    return rr


def _table(*claims: Claim, labels=("ours", "base")) -> PaperTable:
    rows = tuple(PaperRow(label, "quickstart") for label in labels)
    return PaperTable("t", "T", "src", ("DSC",), rows, "faz", (), (labels[-1],), claims)


def _claim(kind="better", rows=("ours",), others=("base",), within=None, metric="dsc"):
    return Claim("c", "says", "Sec. 1", metric, kind, rows, others, within)


BASE = [0.50 + 0.01 * i for i in range(len(CASES))]


def test_a_row_better_on_every_case_holds_and_the_reversed_claim_is_contradicted(tmp_path):
    runs = {
        "ours": _row(tmp_path, "ours", [[v + 0.05 for v in BASE], [v + 0.07 for v in BASE]]),
        "base": _row(tmp_path, "base", [BASE, BASE]),
    }
    claim, reverse = _claim(), _claim(rows=("base",), others=("ours",))
    a = analyse(_table(claim), runs, ["dsc"])
    (v,) = a.claims
    assert v.verdict == "holds"
    c = v.comparisons[0]
    assert c.stats.pairs == len(CASES) and c.stats.dropped == 0
    assert c.stats.median == pytest.approx(6.0)  # seed means: +5 and +7 points -> +6
    assert c.stats.low == pytest.approx(6.0) and c.stats.high == pytest.approx(6.0)
    assert c.stats.p < 1e-3 and c.stats.direction == 1
    assert analyse(_table(reverse), runs, ["dsc"]).claims[0].verdict == "contradicted"
    # a row mean over seeds with its sample sd and t-interval
    s = a.summaries[("ours", "dsc")]
    # site averages (region means) of the two seeds differ by 1 point: sd 1/sqrt(2)
    assert s.n == 2 and s.sd == pytest.approx(1 / math.sqrt(2))
    assert s.high - s.mean == pytest.approx(12.7062047 * s.sd / math.sqrt(2))  # t(0.975, 1)


def test_cells_average_the_sites_as_the_paper_does(tmp_path, toy_paper):
    runs = {"ours": _row(tmp_path, "ours", [BASE, BASE]), "base": _row(tmp_path, "base", [BASE])}
    for rr in runs.values():  # site B has more test cases: the weighted average is higher
        for r in rr.results:
            r["weighted_average"] = {"dsc": {"faz": 0.8, "rim": 0.6}}
    sites = analyse(_table(_claim()), runs, ["dsc"]).summaries[("ours", "dsc")]
    cases = analyse(_table(_claim()), runs, ["dsc"], average="cases").summaries[("ours", "dsc")]
    assert sites.mean == pytest.approx(50 * statistics.fmean(BASE))  # (faz + rim 0) / 2
    assert cases.mean == pytest.approx(70.0) and cases.sd == 0.0
    raw, write = toy_paper
    write(raw)
    assert papers.load_paper("toy").average == "sites"  # the default: each site once
    write({**raw, "average": "cases"})
    assert papers.load_paper("toy").average == "cases"
    write({**raw, "average": "patients"})
    with pytest.raises(ConfigError, match=r"toy.yaml: average: expected sites or cases"):
        papers.load_paper("toy")


def test_distances_are_better_when_lower(tmp_path):
    lower = _row(tmp_path, "ours", [[v - 0.2 for v in BASE]])
    runs = {"ours": lower, "base": _row(tmp_path, "base", [BASE])}
    for rr in runs.values():  # write the same values as hd95 (smaller is better)
        for p in rr.cases:
            text = p.read_text().replace(",dsc,", ",hd95,")
            p.write_text(text)
    a = analyse(_table(_claim(metric="hd95")), runs, ["hd95"])
    assert a.claims[0].verdict == "holds"


def test_identical_rows_are_unresolved_with_p_one(tmp_path):
    runs = {"ours": _row(tmp_path, "ours", [BASE]), "base": _row(tmp_path, "base", [BASE])}
    (v,) = analyse(_table(_claim()), runs, ["dsc"]).claims
    assert v.verdict == "unresolved" and v.comparisons[0].stats.p == 1.0
    assert v.reason == f"{len(CASES)} pairs"


def test_closeness_inside_and_outside_the_margin(tmp_path):
    runs = {
        "ours": _row(tmp_path, "ours", [[v + 0.01 for v in BASE]]),
        "base": _row(tmp_path, "base", [BASE]),
    }
    near = analyse(_table(_claim("close", within=3.5)), runs, ["dsc"]).claims[0]
    assert near.verdict == "holds"
    far = analyse(_table(_claim("close", within=0.5)), runs, ["dsc"]).claims[0]
    assert far.verdict == "contradicted"


def test_holm_against_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> max-accumulated 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_holm_is_applied_over_every_comparison_of_the_table(tmp_path):
    runs = {
        label: _row(tmp_path, label, [[v + shift for v in BASE]])
        for label, shift in (("ours", 0.05), ("mid", 0.0), ("base", 0.0))
    }
    a = analyse(_table(_claim(), labels=("ours", "mid", "base")), runs, ["dsc"])
    tested = [c for c in a.references if c.stats]
    raw = sorted(c.stats.p for c in tested)
    assert len(tested) == 2  # ours-base (shared with the claim), mid-base
    assert min(c.p_holm for c in tested) == pytest.approx(min(1.0, 2 * raw[0]))


def test_holm_counts_the_comparisons_still_to_run_at_p_one(tmp_path):
    labels = ("ours", "mid", "late", "base")
    # planned: 3 rows against the reference (base) and the pair mid-late
    table = _table(_claim(), _claim(rows=("mid",), others=("late",)), labels=labels)
    mixed = [v + (0.05 if i % 5 else -0.01) for i, v in enumerate(BASE)]  # a few cases worse
    ours = _row(tmp_path, "ours", [mixed, mixed])
    base = _row(tmp_path, "base", [BASE, BASE])
    (c,) = analyse(table, {"ours": ours, "base": base}, ["dsc"]).references
    assert c.p_holm == pytest.approx(4 * c.stats.p)
    # two rows short of seeds (one better on every case: a smaller p) cannot lower that bound
    mid = _row(tmp_path, "mid", [[v + 0.3 for v in BASE]])
    late = _row(tmp_path, "late", [BASE])
    runs = {"ours": ours, "mid": mid, "late": late, "base": base}
    a = analyse(table, runs, ["dsc"], seeds=2)
    early = a.claims[1].comparisons[0]
    assert early.stats.p < c.stats.p
    assert a.claims[0].comparisons[0].p_holm == pytest.approx(4 * c.stats.p)
    assert early.p_holm == pytest.approx(4 * early.stats.p)  # the table so far


def test_a_claim_is_contradicted_before_all_its_rows_have_run(tmp_path):
    labels = ("ours", "late", "base")
    claim = _claim(others=("base", "late"))  # ours must beat both
    worse = _row(tmp_path, "ours", [[v - 0.05 for v in BASE], [v - 0.04 for v in BASE]])
    base = _row(tmp_path, "base", [BASE, BASE])
    (v,) = analyse(_table(claim, labels=labels), {"ours": worse, "base": base}, ["dsc"]).claims
    assert v.verdict == "contradicted" and "still to run: ours vs late" in v.reason
    assert [(c.row, c.other) for c in v.comparisons] == [("ours", "base")]
    # a row short of seeds counts as not run yet; a favourable pair decides nothing early
    late = _row(tmp_path, "late", [BASE])
    (v,) = analyse(
        _table(claim, labels=labels), {"ours": worse, "base": base, "late": late}, ["dsc"]
    ).claims
    assert v.verdict == "contradicted"
    better = _row(tmp_path, "ours", [[v + 0.05 for v in BASE], [v + 0.04 for v in BASE]])
    (v,) = analyse(_table(claim, labels=labels), {"ours": better, "base": base}, ["dsc"]).claims
    assert v.verdict == "not run" and "late" in v.reason
    (v,) = analyse(
        _table(claim, labels=labels), {"ours": better, "base": base, "late": late}, ["dsc"]
    ).claims
    assert v.verdict == "not run" and "short of seeds: late (ran seeds [0])" in v.reason
    # rows all short of the planned seeds give no verdict, however their one seed compares
    one = {k: _row(tmp_path, k, [vals]) for k, vals in (("ours", BASE), ("base", BASE))}
    full = analyse(_table(claim, labels=labels), {**one, "late": late}, ["dsc"], seeds=1)
    assert full.claims[0].verdict == "unresolved"
    (v,) = analyse(_table(claim, labels=labels), {**one, "late": late}, ["dsc"], seeds=3).claims
    assert v.verdict == "not run" and "ours (ran seeds [0])" in v.reason


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"train__rounds": 9}, "train.rounds"),
        ({"data__synth__size": 64}, "data.synth"),
        ({"data__root": "data/y"}, "data.root"),
    ],
)
def test_a_claim_on_rows_of_different_data_or_budgets_is_refused(tmp_path, change, named):
    runs = {
        "ours": _row(tmp_path, "ours", [BASE], **change),
        "base": _row(tmp_path, "base", [BASE]),
    }
    (v,) = analyse(_table(_claim()), runs, ["dsc"]).claims
    assert v.verdict == "refused" and named in v.reason and "'ours'" in v.reason


def test_rows_of_other_seeds_or_cases_are_refused(tmp_path):
    runs = {"ours": _row(tmp_path, "ours", [BASE, BASE]), "base": _row(tmp_path, "base", [BASE])}
    (v,) = analyse(_table(_claim()), runs, ["dsc"]).claims
    assert v.verdict == "not run" and "short of seeds: base" in v.reason
    runs["base"] = _row(tmp_path, "base", [BASE, BASE])
    runs["base"].configs[1]["seed"] = 5  # as many seeds, not the same ones
    (v,) = analyse(_table(_claim()), runs, ["dsc"]).claims
    assert v.verdict == "refused" and "seeds [0, 5]" in v.reason
    with pytest.raises(ConfigError, match="different cases"):
        paired({("A", "1"): 1.0}, {("A", "2"): 1.0}, "ours - base")


def test_undefined_cases_are_dropped_and_counted():
    row = {("A", str(i)): float(i) for i in range(6)}
    other = {**{k: v - 1 for k, v in row.items()}, ("A", "0"): math.nan}
    s = paired(row, other, "x")
    assert s.pairs == 5 and s.dropped == 1 and s.median == 1.0


def test_the_evidence_budget_rule():
    rising = [(2, 10.0), (4, 20.0), (6, 30.0), (8, 35.0)]
    assert gain(rising) == pytest.approx(5.0)  # round 8 against round 6 (= 0.75 * 8)
    flat = [(2, 40.0), (4, 41.0), (6, 41.5), (8, 42.0)]
    a = Attempt(8, {"FedAvg": [flat, flat]}, {"FedAvg": 1.0})
    assert a.converged()
    a.curves["LT"] = [rising, rising]
    assert not a.converged()  # every control row must pass
    zero = [(2, 0.0), (4, 0.0), (6, 0.0), (8, 0.0)]
    assert not Attempt(8, {"FedAvg": [zero, zero]}).converged()  # not started is not converged


def test_an_unconverged_budget_doubles_until_the_cap_and_stops_short_of_a_near_copy():
    assert next_rounds(30, 200) == 60  # doubled
    assert next_rounds(30, 57) == 57  # the most that fits
    assert next_rounds(60, 62) is None  # 2 more rounds: a near copy, 62 the budget unrun
    assert next_rounds(60, 75) == 75  # a quarter more is a new attempt
    assert next_rounds(60, 40) is None
    assert next_rounds(1, 2) == 2


PAPER = """
paper: toy
title: Toy paper
metrics: [dsc]
evidence_budget:
  toyfed: {set: {train.rounds: 2}, status: converged, rule: test}
tables:
  t:
    title: Two identical rows
    source: none
    columns: [DSC]
    base: quickstart
    federation: toyfed
    controls: [A]
    reference: [A]
    set: ["data.synth.sites=2", "data.synth.size=32", "data.synth.per_site=12",
          "model.widths=[8,16,32]", "model.dropout=[0,0,0]", "train.local_iters=2",
          "train.batch_size=2"]
    rows:
      - {label: A, published: [80.0]}
      - {label: B, published: [70.0]}
    claims:
      - {id: a-beats-b, says: A beats B, source: Table 1, metric: dsc, better: A, than: B}
"""


@pytest.fixture
def toy_paper(tmp_path, monkeypatch):
    """``write(raw)``: the toy paper file in ``tmp_path`` (the paper index and its cache
    pointed there for the test); ``raw`` starts as :data:`PAPER` with table t's data in
    ``tmp_path``."""
    monkeypatch.setattr(papers, "PAPERS_DIR", tmp_path)
    raw = yaml.safe_load(PAPER)
    raw["tables"]["t"]["set"].append(f"data.root={tmp_path / 'fed'}")

    def write(edited: dict) -> None:
        (tmp_path / "toy.yaml").write_text(yaml.safe_dump(edited))
        papers.load_paper.cache_clear()

    yield raw, write
    papers.load_paper.cache_clear()


def test_identical_configs_end_to_end_and_the_evidence_folder(tmp_path, toy_paper):
    raw, write = toy_paper
    raw["tables"]["t"]["notes"] = ["Row B starts from random weights, the paper's from ImageNet."]
    other = raw["tables"]["u"] = copy.deepcopy(raw["tables"]["t"])
    other["claims"] = [{**other["claims"][0], "id": "b-beats-a", "says": "B beats A"}]
    other["claims"][0].update(better="B", than="A")
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    rep = reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence, command="x")
    (v,) = rep.analysis.claims
    assert v.verdict == "unresolved" and v.comparisons[0].stats.p == 1.0
    for name in ("table.md", "table.csv", "claims.csv", "strip.png", "command.txt"):
        assert (evidence / name).is_file()
    page = (evidence / "table.md").read_text()
    assert "- Row B starts from random weights" in page
    assert "Runs per machine (times compare only within one): " in page  # this CPU: 2 runs
    assert ": 2." in page.split("Runs per machine")[1].splitlines()[0]
    # a run on a GPU is counted by its GPU, not by the CPU of the machine that held it
    on_gpu = copy.deepcopy(rep)
    here = on_gpu.rows[0].results[0]["machine"]
    on_gpu.rows[0].results[0]["machine"] = {**here, "device": "cuda:0 (NVIDIA H200)"}
    line = render_markdown(on_gpu).split("Runs per machine")[1].splitlines()[0]
    entries = line.split(": ", 1)[1].rstrip(".").split("; ")
    gpu = f"cuda:0 (NVIDIA H200) on {here['cpu']}: 1"
    assert sorted(entries) == sorted([gpu, f"{here['cpu']}: 1"])
    assert "Time of the table, summed over its 2 runs: " in page
    kept = evidence / "runs" / "a" / "seed0"
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        ["cases.csv", "config.yaml", "results.json", "rounds.jsonl"]
    )
    index = (tmp_path / "evidence" / "README.md").read_text()
    # one claim, run and unresolved; the paper's other table not run yet
    assert "| Toy paper | 2 | 0 | 0 | 1 | 0 | 0 | 0 | 1 |" in index
    assert "| a-beats-b | A beats B | unresolved |" in index
    assert "| b-beats-a | B beats A | not run |" in index
    assert "| toyfed | toy | train.rounds=2 | converged |" in index  # the budgets table
    assert "Archived evidence" not in index
    assert "readings.md" not in index  # no hand-written readings in this folder
    archived = tmp_path / "evidence" / "archive" / "old-federation"
    archived.mkdir(parents=True)
    (archived / "README.md").write_text("# Toy pages on the old federation\n\nwhy\n")
    shutil.copytree(evidence, archived / "toy-t")  # an archived page is not counted
    index = write_index(tmp_path / "evidence").read_text()
    assert "| Toy paper | 2 | 0 | 0 | 1 | 0 | 0 | 0 | 1 |" in index
    assert "- [Toy pages on the old federation](archive/old-federation/README.md)" in index
    (tmp_path / "evidence" / "readings.md").write_text("# What the verdicts say\n")
    index = write_index(tmp_path / "evidence").read_text()
    assert "[readings.md](readings.md)" in index.split("| paper | claims |")[0]
    hand = tmp_path / "checks"  # a folder whose README.md is written by hand
    shutil.copytree(evidence, hand / "toy-t")
    (hand / "README.md").write_text("# Checks of the readings\n")
    assert write_index(hand) is None
    assert (hand / "README.md").read_text() == "# Checks of the readings\n"
    # a committed finished run counts as done on another machine: nothing is retrained
    shutil.rmtree(tmp_path / "out")
    rep2 = reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence)
    assert not (tmp_path / "out" / "a").exists()
    assert rep2.rows[0].dirs[0] == kept
    claims = list(csv.DictReader((evidence / "claims.csv").open()))
    assert claims[0]["verdict"] == "unresolved" and float(claims[0]["p"]) == 1.0
    assert "capped" not in page
    budget = dataclasses.replace(rep.paper.evidence_budgets["toyfed"], status="capped")
    paper = dataclasses.replace(rep.paper, evidence_budgets={"toyfed": budget})
    capped = render_markdown(dataclasses.replace(rep, paper=paper))
    assert "(train.rounds=2; capped: the largest budget this table fits" in capped


def test_a_row_shared_with_another_table_is_copied_not_retrained(tmp_path, toy_paper):
    raw, write = toy_paper
    other = raw["tables"]["u"] = copy.deepcopy(raw["tables"]["t"])
    other["rows"][0]["set"] = ["name=u-a"]  # a run's name is a label, not a setting
    other["rows"][1]["set"] = ["train.lr=0.002"]  # B differs in u: trained there
    other["claims"] = [{**other["claims"][0], "id": "u-a-beats-b"}]
    write(raw)
    root = tmp_path / "evidence"
    reproduce("toy", "t", "evidence", tmp_path / "out-t", evidence=root / "toy-t")
    rep = reproduce("toy", "u", "evidence", tmp_path / "out-u", evidence=root / "toy-u")
    copied = root / "toy-u" / "runs" / "a" / "seed0"
    assert not (tmp_path / "out-u" / "a").exists()  # A: the same config, not retrained
    assert rep.rows[0].dirs[0] == copied
    assert "copied from toy-t/runs/a/seed0" in (copied / "origin.txt").read_text()
    source = root / "toy-t" / "runs" / "a" / "seed0" / "results.json"
    assert (copied / "results.json").read_bytes() == source.read_bytes()
    assert (tmp_path / "out-u" / "b" / "seed0" / "results.json").is_file()  # B: trained
    assert not (root / "toy-u" / "runs" / "b" / "seed0" / "origin.txt").exists()


def test_an_evidence_folder_keeps_one_budget(tmp_path, toy_paper, monkeypatch):
    raw, write = toy_paper
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=evidence)
    kept = (evidence / "runs" / "a" / "seed0" / "results.json").read_bytes()
    # another budget into the same folder: refused before training, the kept run untouched
    with pytest.raises(ConfigError, match=r"train\.rounds=2, this run has 3.*own --evidence"):
        reproduce(
            "toy",
            "t",
            "evidence",
            tmp_path / "o2",
            overrides=["train.rounds=3"],
            rows=["A"],
            evidence=evidence,
        )
    assert (evidence / "runs" / "a" / "seed0" / "results.json").read_bytes() == kept
    # --set without --evidence: no default evidence folder (it would mix budgets)
    monkeypatch.chdir(tmp_path)
    rep = reproduce(
        "toy", "t", "evidence", tmp_path / "o3", overrides=["train.rounds=3"], rows=["A"]
    )
    assert rep.evidence is None and not (tmp_path / "docs").exists()


def test_rows_run_apart_share_one_page(tmp_path, toy_paper, monkeypatch):
    # two processes share a table's rows (--row): each page shows every row with kept runs
    raw, write = toy_paper
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", rows=["B"], evidence=evidence)
    assert json.loads((evidence / "summary.json").read_text())["seeds"] == {"B": 1}
    rep = reproduce("toy", "t", "evidence", tmp_path / "out", rows=["A"], evidence=evidence)
    assert [r.row.label for r in rep.rows] == ["A", "B"]  # table order, B from its kept run
    summary = json.loads((evidence / "summary.json").read_text())
    assert summary["seeds"] == {"A": 1, "B": 1}
    assert summary["claims"][0]["verdict"] == "unresolved"
    # without an evidence folder the table holds the rows run
    solo = reproduce("toy", "t", "smoke", tmp_path / "out2", rows=["B"])
    assert [r.row.label for r in solo.rows] == ["B"]
    # the page's command is the whole table's: the rows it shows came from any process
    from typer.testing import CliRunner

    from fedseg.cli import app

    args = ["reproduce", "toy", "t", "--budget", "evidence", "--row", "A", "--out"]
    args += [str(tmp_path / "out"), "--evidence", str(evidence)]
    monkeypatch.setattr("sys.argv", ["fedseg", *args])  # what the command line records
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    command = (evidence / "command.txt").read_text().strip()
    assert command.startswith("fedseg reproduce toy t --budget evidence --out ")
    assert "--row" not in command


def test_an_interrupted_table_has_a_page_of_the_rows_it_finished(tmp_path, toy_paper):
    raw, write = toy_paper
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"

    def stop_at_b(name, *_):
        if name.startswith("B"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence, on_run=stop_at_b)
    summary = json.loads((evidence / "summary.json").read_text())
    assert summary["seeds"] == {"A": 1}  # row A's page, written before B ran
    assert summary["claims"][0]["verdict"] == "not run"
    assert "| a-beats-b | A beats B | not run |" in (evidence.parent / "README.md").read_text()


def test_table_notes_must_be_sentences(toy_paper):
    raw, write = toy_paper
    raw["tables"]["t"]["notes"] = "one string, not a list"
    write(raw)
    with pytest.raises(ConfigError, match=r"tables\.t\.notes: expected a list"):
        papers.load_paper("toy")


def test_report_tests_each_row_against_the_first_on_paired_cases(runs):
    from fedseg.reporting.compare import build_report, report_markdown
    from fedseg.reporting.runs import load_run
    from fedseg.reporting.stats import case_values

    report = build_report([load_run(runs[k]) for k in ("mu_small", "mu_large", "seed0")])
    text = report_markdown(report)
    assert "### Paired tests against prox (method.mu=0.01)" in text
    small, large = (case_values(runs[k] / "cases.csv", "dsc") for k in ("mu_small", "mu_large"))
    expected = paired(large, small, "x")
    line = next(x for x in text.splitlines() if x.startswith("| prox (method.mu=0.5) | DSC |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == str(expected.pairs) == str(len(small))
    assert cells[4] == f"{expected.median:.2f} [{expected.low:.2f}, {expected.high:.2f}]"
    assert "reference" in next(
        x for x in text.splitlines() if x.startswith("| prox (method.mu=0.01) | DSC |")
    )


def test_a_measured_budget_is_recorded_in_the_paper_file(tmp_path):
    from fedseg.reproduce.budget import Calibration

    paper = tmp_path / "toy.yaml"
    raw = yaml.safe_load(PAPER)
    del raw["evidence_budget"]
    paper.write_text(yaml.safe_dump(raw, sort_keys=False))
    table = papers._table(paper, "t", raw["tables"]["t"], ("dsc",))
    flat = [(6, 40.0), (8, 40.5)]
    attempts = [Attempt(8, {"A": [flat, flat]}, {"A": 1.0})]
    cal = Calibration("toy", table, {"A": 1.0, "B": 3.0}, attempts, tmp_path)
    cal.record(paper)
    cal.record(paper)  # a second record replaces the federation's entry
    entry = yaml.safe_load(paper.read_text())["evidence_budget"]["toyfed"]
    assert entry["set"] == {"train.rounds": 8} and entry["status"] == "converged"
    assert entry["gains"] == {"8": {"A": 0.5}} and entry["final_val_dsc"] == {"8": {"A": 40.5}}
    assert yaml.safe_load(paper.read_text())["tables"] == raw["tables"]
    # each row's own cost: (1 + 3) CPU s x 8 rounds x 3 seeds / 2 cores
    assert entry["table_hours"] == round(4.0 * 8 * 3 / 2 / 3600, 1)
    assert cal.table_hours(900) == pytest.approx(4.0 * 900 * 3 / 2 / 3600)
    assert "Left out" not in cal.report()
    cal.left_out = {"C": "4 tokens per branch (< 8)"}  # a row inert by its config: not probed
    assert "\n- C: 4 tokens per branch (< 8)\n" in cal.report()
    rising = [(6, 30.0), (8, 35.0)]  # unconverged, and the cap binds 2 rounds past it
    cal = Calibration("toy", table, {"A": 1.0}, [Attempt(8, {"A": [rising]}, {"A": 1.0})], tmp_path)
    cal.done, cal.capped_at = True, 9
    cal.record(paper)
    entry = yaml.safe_load(paper.read_text())["evidence_budget"]["toyfed"]
    assert entry["set"] == {"train.rounds": 9} and entry["status"] == "capped"
    assert entry["gains"] == {"8": {"A": 5.0}}  # measured at the attempt, not at 9
    assert "`train.rounds: 9` (capped) (the most rounds that fit, 1 past" in cal.report()


def test_calibration_probes_the_cost_of_every_row_once(tmp_path, monkeypatch):
    from fedseg.reproduce import budget

    monkeypatch.setattr(papers, "PAPERS_DIR", tmp_path)
    monkeypatch.setattr(budget, "PAPERS_DIR", tmp_path)
    monkeypatch.setattr(budget, "DOUBLINGS", 0)
    raw = yaml.safe_load(PAPER)
    raw["tables"]["t"]["set"] += [f"data.root={tmp_path / 'fed'}", "train.rounds=2"]
    raw["tables"]["t"]["rows"][1]["set"] = ["train.local_iters=6"]  # B costs more per round
    del raw["evidence_budget"]
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    papers.load_paper.cache_clear()
    folder, out = tmp_path / "budget", tmp_path / "out"
    try:
        cal = budget.calibrate("toy", "t", overrides=["train.lr=0.002"], out=out, folder=folder)
        assert set(cal.row_cpu) == {"A", "B"} and cal.row_cpu["B"] > cal.row_cpu["A"] > 0
        entry = yaml.safe_load((tmp_path / "toy.yaml").read_text())["evidence_budget"]["toyfed"]
        assert entry["set"] == {"train.lr": 0.002, "train.rounds": 2}  # fixed part recorded
        kept = yaml.safe_load((folder / "runs" / "r2" / "a" / "seed0" / "config.yaml").read_text())
        assert kept["train"]["lr"] == 0.002
        assert sorted(p.name for p in (folder / "probes").iterdir()) == ["a", "b"]
        assert "| B | " in (folder / "budget.md").read_text()
        shutil.rmtree(out)
        again = budget.calibrate("toy", "t", overrides=["train.lr=0.002"], out=out, folder=folder)
        assert again.row_cpu == cal.row_cpu and not out.exists()  # kept probes and runs reused
    finally:
        papers.load_paper.cache_clear()


def test_html_report_shows_the_paired_tests_and_a_strip_plot(runs, tmp_path):
    from fedseg.reporting.html import write_report

    written = write_report([runs["mu_small"], runs["mu_large"]], tmp_path / "rep")
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Paired tests against prox (method.mu=0.01)" in page
    strips = [p for p in written if p.name.startswith("strip_")]
    assert len(strips) == 1 and strips[0].stat().st_size > 0
    assert 'alt="per-case values (mean over seeds), median marked"' in page


def test_jobs_run_a_table_in_worker_processes_with_the_same_numbers(tmp_path, toy_paper):
    raw, write = toy_paper
    raw["tables"]["t"]["set"].append("engine.threads=1")  # one thread everywhere: same sums
    write(raw)
    seen = []
    args = dict(seeds=2, on_run=lambda name, res, s: seen.append(name))
    one = reproduce("toy", "t", "evidence", tmp_path / "one", evidence=tmp_path / "e1", **args)
    two = reproduce(
        "toy", "t", "evidence", tmp_path / "two", evidence=tmp_path / "e2", workers=2, **args
    )
    assert (
        sorted(seen[4:])
        == sorted(seen[:4])
        == ["A (seed 0)", "A (seed 1)", "B (seed 0)", "B (seed 1)"]
    )
    assert [r.row.label for r in two.rows] == ["A", "B"]
    for r1, r2 in zip(one.rows, two.rows, strict=True):
        assert [d.name for d in r2.dirs] == ["seed0", "seed1"]
        for a, b in zip(r1.results, r2.results, strict=True):
            assert a["average"]["dsc"] == b["average"]["dsc"]
    assert (tmp_path / "e2" / "runs" / "b" / "seed1" / "cases.csv").is_file()
    assert "| A | 2 |" in (tmp_path / "e2" / "table.md").read_text()


def test_a_failing_worker_stops_the_table_and_finished_runs_stay_kept(tmp_path, toy_paper):
    raw, write = toy_paper
    write(raw)
    stray = tmp_path / "out" / "b" / "seed0"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("not a fedseg run")  # B's worker refuses to delete it
    evidence = tmp_path / "evidence"
    with pytest.raises(ConfigError, match="is no fedseg run directory"):
        reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence, workers=2)
    assert (evidence / "runs" / "a" / "seed0" / "cases.csv").is_file()  # A ran on, kept
    assert not (evidence / "runs" / "b").exists()
    (stray / "notes.txt").unlink()
    seen = []
    reproduce(
        "toy",
        "t",
        "evidence",
        tmp_path / "out",
        evidence=evidence,
        workers=2,
        on_run=lambda name, res, s: seen.append((name, s)),
    )
    assert seen[0] == ("A (seed 0)", 0.0) and seen[1][0] == "B (seed 0)"  # A reused, B ran


def test_jobs_prepare_the_data_before_any_worker_starts(tmp_path):
    from fedseg.reproduce.runs import Job, run_jobs, worker_threads

    raw = {"data": {"root": str(tmp_path / "missing")}, "train": {"rounds": 1}}
    jobs = [Job({**raw, "seed": k}, "<test>", tmp_path / f"run{k}") for k in range(2)]
    with pytest.raises(ConfigError, match=r"holds no manifest\.json"):
        list(run_jobs(jobs, workers=2))
    with pytest.raises(ConfigError, match="--jobs 0"):
        list(run_jobs(jobs, workers=0))
    assert worker_threads(2, jobs[0].config()) in (0, max(1, (os.cpu_count() or 1) // 2))


def test_an_interrupted_run_continues_from_its_checkpoint_to_the_same_numbers(tmp_path):
    from fedseg.engine.runner import InProcessRunner
    from fedseg.reproduce.runs import Job, interrupted_run, run_config
    from fedseg.testing import synth_folder

    root = synth_folder(tmp_path / "fed", "fundus", per_site=6, size=32)
    raw = {
        "seed": 1,
        "data": {"root": str(root)},
        "train": {"rounds": 3, "local_iters": 1, "batch_size": 2},
    }
    full = run_config(copy.deepcopy(raw), tmp_path / "full")

    def stop_after_round_1(record):
        if record["round"] == 1:
            raise KeyboardInterrupt  # the session ends mid-run

    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        InProcessRunner(Job(raw, "<test>", cut).config(), cut).run(on_round=stop_after_round_1)
    before = (cut / "rounds.jsonl").read_text()
    assert interrupted_run(cut, Job(raw, "<test>", cut).config())
    other = Job({**raw, "seed": 2}, "<test>", cut).config()
    assert not interrupted_run(cut, other)  # another config starts afresh
    resumed = run_config(copy.deepcopy(raw), cut)
    assert resumed["sites"] == full["sites"]
    assert (cut / "rounds.jsonl").read_text().startswith(before)  # rounds 0-1 not rerun


def test_a_claim_on_a_row_measured_inert_is_not_testable(tmp_path):
    runs = {
        "ours": _row(tmp_path, "ours", [[v + 0.05 for v in BASE]]),
        "base": _row(tmp_path, "base", [BASE]),
    }
    table = _table(_claim())
    assert analyse(table, runs, ["dsc"]).claims[0].verdict == "holds"
    (v,) = analyse(table, runs, ["dsc"], inert={"ours": "4 tokens (< 8)"}).claims
    assert v.verdict == "not testable at this size" and v.reason == "ours: 4 tokens (< 8)"
    assert v.comparisons[0].stats.median == pytest.approx(5.0)  # still shown, no verdict drawn
    assert analyse(table, runs, ["dsc"], inert={"other": "x"}).claims[0].verdict == "holds"


def _sheet(rounds: dict) -> list[dict]:
    """A protocol sheet whose aspects are all "not stated" but its ``rounds`` item."""
    sheet = [
        {"aspect": a, "paper": "not stated", "ours": "x", "status": "not stated"}
        for a in protocol.ASPECTS
    ]
    sheet[4] = {"aspect": "rounds", "paper": "400", "status": "forced", "why": "CPU", **rounds}
    return sheet


def test_render_only_trains_nothing_and_marks_a_changed_table(tmp_path, toy_paper):
    raw, write = toy_paper
    sheet = _sheet({"ours": "2", "cost": {"factor": 200, "basis": "400 / 2 rounds"}})
    raw["tables"]["t"]["protocol"] = sheet
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence)
    page = (evidence / "table.md").read_text()
    assert "| rounds | 400 | 2 | `—` " not in page and "| rounds | 400 | 2 | — |" in page
    assert "**forced**: about" in page and "(400 / 2 rounds); CPU |" in page
    assert "| DSC (%) | 95 % CI |" in page and "![Per-case values" in page
    index = (evidence.parent / "README.md").read_text()
    assert "| toy | [t](toy-t/table.md) | 1 unresolved | rounds: 2 |" in index
    # the config changes after the runs: a rerun would train; render-only does not
    raw["tables"]["t"]["set"].append("train.lr=0.002")
    raw["tables"]["t"]["changed"] = {"date": "2026-12-01", "what": "lr 0.002 now."}
    sheet[3] = {**sheet[3], "status": "unforced", "paper": "0.002", "ours": "0.001"}
    write(raw)
    rep = reproduce("toy", "t", "evidence", tmp_path / "re", evidence=evidence, render_only=True)
    assert not (tmp_path / "re" / "a").exists() and not (tmp_path / "re" / "b").exists()
    assert [len(r.results) for r in rep.rows] == [1, 1]  # the kept runs, under the old config
    page = (evidence / "table.md").read_text()
    assert "> **Config changed on 2026-12-01, rows pending rerun.** lr 0.002 now." in page
    assert "| learning rate and schedule | 0.002 | 0.001 | — | **unforced** |" in page
    index = (evidence.parent / "README.md").read_text()
    assert "| a-beats-b | A beats B | pending rerun (config changed on 2026-12-01; was " in index
    assert "| Toy paper | 1 | 0 | 0 | 0 | 0 | 0 | 1 | 0 |" in index
    with pytest.raises(ConfigError, match="--render-only renders an evidence page"):
        reproduce("toy", "t", "smoke", tmp_path / "x", render_only=True)


def test_a_cost_per_key_follows_what_the_runs_recorded(tmp_path, toy_paper):
    raw, write = toy_paper
    cost = {"per": "train.rounds", "paper": 400}
    rounds = {"ours": "the budget", "keys": ["train.rounds"], "cost": cost}
    raw["tables"]["t"]["protocol"] = _sheet(rounds)
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence)
    page = (evidence / "table.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| rounds |"))
    assert row.startswith("| rounds | 400 | the budget | `train.rounds` 2 | **forced**: about ")
    assert row.endswith(" CPU h (400 / 2 rounds); CPU |")
    # the budget recalibrated to 3 rounds and row B's run replaced by one at it (the page
    # before its rerun ends): the kept runs disagree, so no cost is given
    raw["evidence_budget"]["toyfed"]["set"]["train.rounds"] = 3
    write(raw)
    other = tmp_path / "evidence-3"
    reproduce("toy", "t", "evidence", tmp_path / "b3", evidence=other, rows=["B"])
    shutil.rmtree(evidence / "runs" / "b")
    shutil.copytree(other / "runs" / "b", evidence / "runs" / "b")
    reproduce("toy", "t", "evidence", tmp_path / "re", evidence=evidence, render_only=True)
    page = (evidence / "table.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| rounds |"))
    assert "**forced**: no cost given (`train.rounds` recorded as 2 / 3); CPU |" in row
    assert "CPU h" not in row


def test_the_authors_code_rows_read_the_claims_again(tmp_path, toy_paper):
    """A parity arm stands in for its row where it shares the seed and budget; the page, its
    summary and the index show the claim's verdict with it beside fedseg's."""
    raw, write = toy_paper
    write(raw)
    evidence = tmp_path / "evidence" / "toy-t"
    reproduce("toy", "t", "evidence", tmp_path / "out", evidence=evidence)
    ours = evidence / "runs" / "a" / "seed0"
    arm = tmp_path / "evidence" / "parity" / "toy" / "authors-A" / "seed0"
    arm.mkdir(parents=True)
    shutil.copyfile(ours / "results.json", arm / "results.json")
    rows = list(csv.DictReader((ours / "cases.csv").open()))
    for r in rows:  # the authors' A: a perfect score on every case, so A beats B
        r["value"] = "1.0" if r["metric"] == "dsc" else r["value"]
    with (arm / "cases.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    train = yaml.safe_load((ours / "config.yaml").read_text())["train"]
    (arm / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "train": train}))
    raw["tables"]["t"]["parity"] = {"runs": "parity/toy", "rows": {"A": "authors-A"}}
    write(raw)

    rep = reproduce("toy", "t", "evidence", tmp_path / "re", evidence=evidence, render_only=True)
    page = (evidence / "table.md").read_text()
    section = page.split("### The claims with the authors' code")[1]
    (line,) = [x for x in section.splitlines() if x.startswith("| a-beats-b")]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[1] == "A − B" and float(cells[2]) > 0
    assert cells[3].startswith("**") and cells[4] == rep.analysis.claims[0].verdict
    summary = json.loads((evidence / "summary.json").read_text())
    assert summary["claims"][0]["authors"]["verdict"] == cells[3].split("**")[1]
    index = (tmp_path / "evidence" / "README.md").read_text()
    assert "| claim | says | verdict | with the authors' code |" in index

    # an arm of another budget does not stand in
    (arm / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "train": {**train, "lr": 9.0}}))
    reproduce("toy", "t", "evidence", tmp_path / "re", evidence=evidence, render_only=True)
    assert "### The claims with the authors' code" not in (evidence / "table.md").read_text()
    bad = {"runs": "parity/toy", "rows": {"Z": "authors-Z"}}
    raw["tables"]["t"]["parity"] = bad
    write(raw)
    with pytest.raises(ConfigError, match=r"parity\.rows: no row 'Z'"):
        papers.load_paper("toy")
