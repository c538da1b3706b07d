"""``results.md`` of a Flower run in which a site died says which sites are missing and that the
averages cover only the sites that reported."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")


def test_results_md_names_the_sites_that_did_not_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "flower"))
    from flower_helpers import direct_link, make_config

    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels
    from fedseg.engine.flower.link import run_federation
    from fedseg.outputs import write_run_outputs
    from fedseg.reporting.results import site_table

    root = tmp_path / "fed"
    synthesize("fundus", root, sites=2, size=32, per_site=8, seed=0)
    generate_weak_labels(root, seed=0)
    cfg = make_config(root, "fedavg", rounds=1)
    run = tmp_path / "run"
    link, settings = direct_link(cfg, root, run)
    link.tamper_eval["B"] = lambda body: "no reply within 1s"  # B dies before evaluating
    results = run_federation(cfg, settings, link)
    assert list(results["sites"]) == ["A"] and results["average"] == results["sites"]["A"]

    write_run_outputs(run, results)
    lines = (run / "results.md").read_text().splitlines()
    note = [line for line in lines if "Missing sites" in line]
    assert note == [
        "**Missing sites: 1 of 2 did not report an evaluation: B (no reply within 1s). "
        "The averages are over the 1 site above only.**"
    ]
    assert not any(line.startswith("| B |") for line in lines)

    del results["missing_sites"]
    assert "Missing sites" not in site_table(results)
