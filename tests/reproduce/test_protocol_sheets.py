"""Protocol sheets of the paper files, the mechanism measurements over kept runs, and the
synthetic federation's split setting that gives the small sites their validation cases."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from fedseg.config import parse_config
from fedseg.engine.prepare import prepare_data
from fedseg.errors import ConfigError
from fedseg.reproduce.papers import PAPERS_DIR, list_papers, load_paper
from fedseg.reproduce.protocol import ASPECTS, Mechanism, inert, measure, parse_protocol

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"

SHEET = [{"aspect": a, "paper": "not stated", "ours": "x", "status": "not stated"} for a in ASPECTS]


@pytest.mark.parametrize("paper", list_papers())
def test_every_shipped_table_has_a_complete_protocol_sheet(paper):
    p = load_paper(paper)
    for t in p.tables.values():
        assert tuple(i.aspect for i in t.protocol) == ASPECTS, t.name
        for item in t.forced():
            assert item.why, (t.name, item.aspect)
        if any(i.status == "unforced" for i in t.protocol):
            assert t.changed is not None, t.name


def test_every_evidence_page_belongs_to_a_table_with_a_sheet():
    for summary in EVIDENCE.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        assert load_paper(s["paper"]).table(s["table"]).protocol, summary


def _raw_table(**extra):
    return {"protocol": copy.deepcopy(SHEET), **extra}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["protocol"].pop(), "expected each aspect once, in order"),
        (lambda t: t["protocol"].reverse(), "expected each aspect once, in order"),
        (lambda t: t["protocol"][4].update(status="forced"), "protocol[4]: Value error, a forced"),
        (lambda t: t["protocol"][0].update(status="maybe"), "protocol[0].status"),
        (lambda t: t["protocol"][1].update(status="unforced"), "an unforced difference must"),
        (lambda t: t.update(changed={"date": "1 Dec", "what": "x"}), "changed.date"),
        (
            lambda t: t["protocol"][4].update(why="CPU", cost={"per": "train.rounds"}),
            "expected either 'factor' and 'basis', or 'per' and 'paper'",
        ),
        (
            lambda t: t["protocol"][4].update(why="CPU", cost={"factor": 2.0}),
            "a 'factor' needs its 'basis'",
        ),
        (
            lambda t: t["protocol"][4].update(
                why="CPU", cost={"factor": 2.0, "basis": "b", "paper": 300}
            ),
            "expected either 'factor' and 'basis', or 'per' and 'paper'",
        ),
        (
            lambda t: t.update(
                mechanisms=[{"id": "m", "what": "w", "rows": ["A"], "measure": "?"}]
            ),
            "mechanisms[0]: Value error, measure '?'",
        ),
        (
            lambda t: t.update(
                mechanisms=[{"id": "m", "what": "w", "rows": ["Z"], "measure": "finch_clusters"}]
            ),
            "mechanisms[0].rows: no row 'Z'",
        ),
    ],
)
def test_a_bad_sheet_is_refused_naming_its_field(edit, message):
    raw = _raw_table()
    edit(raw)
    with pytest.raises(ConfigError, match=r"^paper\.yaml: tables\.t") as e:
        parse_protocol(raw, "paper.yaml: tables.t", {"A"})
    assert message in str(e.value)


def test_a_forced_difference_with_its_cost_and_a_changed_table_parse():
    raw = _raw_table(changed={"date": "2026-12-01", "what": "batch 8 now"})
    raw["protocol"][1].update(status="unforced", paper="8", ours="2")
    raw["protocol"][4].update(
        status="forced", paper="300", ours="77", why="CPU", cost={"factor": 3.9, "basis": "r"}
    )
    items, changed, _ = parse_protocol(raw, "w", {"A"})
    assert items[4].cost.factor == 3.9 and changed.date == "2026-12-01"


def _run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_codebook_clusters_and_weights_are_measured_from_rounds_jsonl(tmp_path):
    vq = [
        {"round": 0, "clients": {s: {"vq_codes": 512.0, "vq_dead_codes": 400.0} for s in "AB"}},
        {"round": 1, "clients": {"A": {"vq_codes": 512.0, "vq_dead_codes": 509.0},
                                 "B": {"vq_codes": 512.0, "vq_dead_codes": 507.0}}},
    ]  # fmt: skip
    codes = Mechanism(id="c", what="codes", rows=("S",), measure="vq_live_codes", inert_below=8)
    found = measure(codes, {"S": ([_run(tmp_path / "vq", vq)], [{}])})
    assert found["S"].value == pytest.approx(4.0)  # (3 + 5) / 2 at the last round
    assert "4.0 of 512 codes" in found["S"].text
    assert inert(codes, found) == {"S": f"codes: {found['S'].text} (< 8)"}

    clusters = [
        {"round": 0, "clients": {}, "server": {"clusters": {"enc": [1, 1], "dec": [1, 1]}}},
        {"round": 1, "clients": {}, "server": {"clusters": {"enc": [2, 1], "dec": [3, 1]}}},
    ]
    finch = Mechanism(id="f", what="FINCH", rows=("F",), measure="finch_clusters")
    got = measure(finch, {"F": ([_run(tmp_path / "f", clusters)], [{}])})["F"]
    assert got.value == pytest.approx(11 / 8)
    assert "one per class at every level in 1 of 2 rounds" in got.text
    assert inert(finch, {"F": got}) == {}  # measured only: no bound

    w = [
        {"round": r, "clients": {}, "server": {"aaw_weights": {"A": a, "B": 1 - a}}}
        for r, a in enumerate([0.5, 0.3, 0.0005, 0.0002])
    ]
    aaw = Mechanism(id="a", what="AAW", rows=("W", "none"), measure="aaw_weights")
    got = measure(aaw, {"W": ([_run(tmp_path / "w", w)], [{}]), "none": ([], [])})
    assert list(got) == ["W"]  # a row without runs is not measured
    assert got["W"].value == pytest.approx(1 - 2 * 0.0002)
    assert "a site at weight < 0.001 in 2 of 2 second-half rounds" in got["W"].text


def test_learnable_aggregation_that_never_steps_is_inert(tmp_path):
    def rounds(first_la: int) -> list[dict]:
        return [
            {"round": r, "clients": {"A": {"loss": 0.1}, "B": {"la_steps": 3.0 * (r >= first_la)}}}
            for r in range(4)
        ]

    la = Mechanism(id="la", what="LA", rows=("S", "T"), measure="la_rounds", inert_below=1)
    cfg = {"method": {"la_skip_rounds": 50}}
    got = measure(
        la,
        {
            "S": ([_run(tmp_path / "s", rounds(9))], [cfg]),
            "T": ([_run(tmp_path / "t0", rounds(1)), _run(tmp_path / "t1", rounds(2))], [cfg] * 2),
        },
    )
    assert got["S"].text == "LA acted in 0 of 4 rounds (mean over seeds); warm-up 50 rounds"
    assert got["T"].value == pytest.approx(2.5)
    assert list(inert(la, got)) == ["S"]


def test_the_bottleneck_of_a_3d_synergynet_at_the_cpu_size_is_inert():
    cfg = {"data": {"synth": {"task": "pancreas3d", "size": 32}}, "model": {"widths": [1] * 5}}
    m = Mechanism(id="b", what="tokens", rows=("S",), measure="bottleneck_side", inert_below=8)
    got = measure(m, {"S": ([Path("unused")], [cfg])})["S"]
    assert got.text == "input 16 x 32 x 32: bottleneck 1 x 2 x 2 = 4 tokens per branch"
    assert "S" in inert(m, {"S": got})
    cfg["data"]["synth"]["size"] = 128  # 64 x 128 x 128 -> 4 x 8 x 8: the grid the design needs
    assert inert(m, measure(m, {"S": ([Path("unused")], [cfg])})) == {}


def test_a_config_check_measures_a_row_not_run_on_its_planned_config():
    cfg = {"data": {"synth": {"task": "pancreas3d", "size": 32}}, "model": {"widths": [1] * 5}}
    b = Mechanism(id="b", what="tokens", rows=("S", "T"), measure="bottleneck_side", inert_below=8)
    got = measure(b, {}, {"S": cfg})
    assert got["S"].text.endswith("4 tokens per branch (the planned config; not run)")
    assert list(inert(b, got)) == ["S"]  # T has neither runs nor a planned config
    codes = Mechanism(id="c", what="codes", rows=("S",), measure="vq_live_codes")
    assert measure(codes, {}, {"S": cfg}) == {}  # a check of the runs needs runs


def test_synergynet_claims_are_not_testable_before_any_run_and_left_out_of_the_budget(tmp_path):
    from fedseg.reproduce.budget import inert_rows
    from fedseg.reproduce.harness import reproduce
    from fedseg.reproduce.protocol import NOT_TESTABLE

    rep = reproduce(
        "pancreas3d", "table2-t1", "smoke", evidence=tmp_path / "page", render_only=True
    )
    verdicts = {v.claim.id: v.verdict for v in rep.analysis.claims}
    synergy = {k: v for k, v in verdicts.items() if k.endswith("-synergynet")}
    assert len(synergy) == 4 and set(synergy.values()) == {NOT_TESTABLE}
    assert {v for k, v in verdicts.items() if k not in synergy} == {"not run"}
    page = (tmp_path / "page" / "table.md").read_text()
    assert "(the planned config; not run)" in page and "seeds per row: none yet" in page
    assert "Time of the table" not in page  # no runs, no time line

    table = load_paper("pancreas3d").table("table2-t1")
    left_out = inert_rows(table, {"data.synth.size": 32})
    assert sorted(left_out) == [
        "FedAvg (SynergyNet)",
        "FedAvg+AAW (SynergyNet)",
        "No FL (SynergyNet)",
    ]
    assert "bottleneck 1 x 2 x 2" in left_out["No FL (SynergyNet)"]
    assert inert_rows(table, {"data.synth.size": 128}) == {}


def test_the_cost_probe_skips_the_rows_left_out(tmp_path, monkeypatch):
    from fedseg.reproduce import budget
    from fedseg.reproduce.runs import Finished

    probed = []

    def fake_jobs(jobs, workers):  # record what would train; each probe 1 CPU s a round
        for i, job in enumerate(jobs):
            probed.append(job.run_dir.name)
            timing = {"round_seconds": [1.0] * 3, "round_cpu_seconds": [1.0] * 3}
            yield Finished(i, {"timing": timing}, job.run_dir, 1.0, False)

    monkeypatch.setattr(budget, "run_jobs", fake_jobs)
    table = load_paper("pancreas3d").table("table2-t1")
    fixed = {"data.synth.size": 32}
    costs = budget.probe_costs(
        table, fixed, tmp_path / "b", tmp_path / "o", skip=budget.inert_rows(table, fixed)
    )
    assert list(costs) == ["No FL", "FedAvg", "FedAvg+AAW", "FedProx+AAW (not in the paper)"]
    assert not any("synergynet" in name for name in probed) and len(probed) == 4


class _Planned(Exception):
    """Raised by a stand-in for run_jobs once it has seen what would train."""


def test_reproduce_skips_rows_inert_by_config_unless_a_row_names_them(monkeypatch, caplog):
    from fedseg.reproduce import harness

    planned: list[list[str]] = []

    def record(jobs, workers):  # what would train, then stop before any training
        planned.append([str(job.run_dir.relative_to(job.run_dir.parents[1])) for job in jobs])
        raise _Planned
        yield

    monkeypatch.setattr(harness, "run_jobs", record)
    with pytest.raises(_Planned), caplog.at_level("WARNING"):
        harness.reproduce("pancreas3d", "table2-t1", "smoke", out=Path("unused"))
    rows = sorted({name.split("/")[0] for name in planned[-1]})
    assert rows == ["fedavg", "fedavg-aaw", "fedprox-aaw-not-in-the-paper", "no-fl"]
    skipped = [r.getMessage() for r in caplog.records if "not trained" in r.getMessage()]
    assert len(skipped) == 3 and all("bottleneck 1 x 2 x 2" in m for m in skipped)
    with pytest.raises(_Planned):  # named, it trains (the user asked for it)
        harness.reproduce(
            "pancreas3d", "table2-t1", "smoke", out=Path("unused"), rows=["No FL (SynergyNet)"]
        )
    assert planned[-1] == ["no-fl-synergynet/seed0"]


def test_the_pancreas_experiments_train_an_epoch_per_round_with_3_validation_volumes(tmp_path):
    from fedseg.reproduce.harness import _seed_runs

    paper = load_paper("pancreas3d")
    assert paper.distance_unit == "mm"
    for name, task in (("table2-t1", "pancreas3d_t1"), ("table2-t2", "pancreas3d_t2")):
        t = paper.table(name)
        assert t.federation == f"pancreas3d-{name[-2:]}"  # each experiment its own budget
        for row in t.rows:  # at the size the budget fixes (its rounds are calibrated)
            ((_, _, cfg, _),) = _seed_runs(row, "evidence", {"data.synth.size": 32}, [], 1)
            assert cfg.data.synth.task == task
            assert (cfg.train.local_epochs, cfg.train.batch_size, cfg.train.lr) == (1, 8, 1e-4)
    assert list(paper.tables) == ["table2-t1", "table2-t2"]  # the mixed table is archived
    assert not any(i.status == "unforced" for t in paper.tables.values() for i in t.protocol)
    raw = yaml.safe_load((PAPERS_DIR / "pancreas3d.yaml").read_text())
    assert raw["distance_unit"] == "mm"


def test_the_split_setting_gives_small_sites_more_validation_cases(tmp_path):
    def val_counts(split):
        synth = {"task": "fundus", "sites": 2, "size": 32, "per_site": 10, "weak_labels": False}
        if split:
            synth["split"] = split
        raw = {
            "name": "split",
            "data": {"root": str(tmp_path / f"fed{len(split or [])}"), "synth": synth},
            "train": {"rounds": 1, "local_iters": 1, "batch_size": 2},
        }
        root = prepare_data(parse_config(raw, "<test>"))
        manifest = json.loads((root / "manifest.json").read_text())
        return [site["splits"]["val"] for site in manifest["sites"]]

    assert max(val_counts(None)) <= 2
    assert min(val_counts([0.4, 0.4, 0.2])) >= 3
