"""Figures a person reads: the affinity map's colour range and axis labels, the AAW weight
plot's legend (outside the lines, with site sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from matplotlib import pyplot as plt

from fedseg.reporting.affinity import affinity_figure
from fedseg.reporting.plots import render_run_plots
from fedseg.reporting.runs import site_facts
from fedseg.reporting.weights_plot import weights_figure


def _run_dir(tmp_path: Path, like: Path, records: list[dict]) -> Path:
    """A run directory on ``like``'s federation holding ``records`` as its rounds."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = yaml.safe_load((like / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"root": cfg["data"]["root"]}}))
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_affinity_map_spans_its_values_and_names_annotations(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    matrix = [[1.0, 0.91, 0.95], [0.91, 1.0, 0.93], [0.95, 0.93, 1.0]]
    names = ["A", "B", "C"]  # the federation has A and B only: C is shown by name alone
    server = {"affinity": matrix, "affinity_sites": names}
    run = _run_dir(tmp_path, runs["seed0"], [{"round": 0, "clients": {}, "server": server}])
    facts = site_facts(run)
    assert set(facts) == {"A", "B"}
    fig = affinity_figure(run)
    ax = fig.axes[0]
    assert ax.images[0].get_clim() == (0.91, 0.95)
    want = [f"A\n({facts['A'].annotation})", f"B\n({facts['B'].annotation})", "C"]
    assert [t.get_text() for t in ax.get_xticklabels()] == want
    assert [t.get_text() for t in ax.get_yticklabels()] == want
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:.3f}" for r in matrix for v in r)
    plt.close(fig)
    assert [p.name for p in render_run_plots(run)] == ["affinity.png"]  # no losses: no curves


def test_weight_legend_is_outside_and_names_site_sizes(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    records = [
        {
            "round": r,
            "clients": {},
            "server": {"aaw_weights": {"A": 0.4 + r / 10, "B": 0.6 - r / 10}},
        }
        for r in range(3)
    ]
    run = _run_dir(tmp_path, runs["seed0"], records)
    sizes = {s: f.num_train for s, f in site_facts(run).items()}
    assert sizes and all(v > 0 for v in sizes.values())
    fig = weights_figure(records, sizes=sizes)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [f"{s} (n={sizes[s]})" for s in "AB"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    plt.close(fig)
    assert [p.name for p in render_run_plots(run)] == ["aaw_weights.png"]
