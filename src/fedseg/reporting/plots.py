"""Figures a run directory gets at the end, chosen by what its ``rounds.jsonl`` records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.reporting.affinity import plot_affinity
from fedseg.reporting.context import MISSED_MARK, MISSED_NOTE, missed_regions
from fedseg.reporting.runs import read_rounds, site_facts
from fedseg.reporting.strip import short_labels
from fedseg.reporting.weights_plot import plot_weights

if TYPE_CHECKING:
    from fedseg.reporting.compare import Section

__all__ = [
    "PLOTS",
    "final_dsc",
    "loss_history",
    "plot_row_curves",
    "plot_site_bars",
    "plot_training_curves",
    "render_run_plots",
    "val_dsc_history",
]

PLOTS: dict[str, Callable[[Path], Path]] = {
    "affinity": plot_affinity,
    "aaw_weights": lambda run: plot_weights(
        run, run / "aaw_weights.png", sizes={s: f.num_train for s, f in site_facts(run).items()}
    ),
}
"""Server metric recorded per round -> function drawing it into the run directory."""

DISTANCES = ("hd95", "assd", "hd")


def render_run_plots(run_dir: Path) -> list[Path]:
    """Draw ``training_curves.png`` (when rounds record client losses) and every figure whose
    server metric appears in ``run_dir/rounds.jsonl``."""
    run_dir = Path(run_dir)
    records = read_rounds(run_dir)
    keys: set[str] = set()
    for rec in records:
        keys |= set(rec.get("server") or {})
    out = []
    if loss_history(records):
        final = final_dsc(run_dir / "results.json")
        out.append(plot_training_curves(records, run_dir / "training_curves.png", final=final))
    return out + [draw(run_dir) for key, draw in PLOTS.items() if key in keys]


def loss_history(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per site, ``(round, training loss)`` of every round the site reported a loss."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        for site, metrics in (rec.get("clients") or {}).items():
            if isinstance(metrics, dict) and metrics.get("loss") is not None:
                out.setdefault(site, []).append((int(rec["round"]), float(metrics["loss"])))
    return out


def val_dsc_history(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per site, ``(round, DSC averaged over regions)`` of every periodic evaluation
    (``eval`` in a round record: ``{site: {region: dsc}}`` or ``{site: {"dsc": {...}}}``)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        for site, scores in (rec.get("eval") or {}).items():
            regions = scores.get("dsc", scores) if isinstance(scores, dict) else {}
            values = [float(v) for v in regions.values() if isinstance(v, int | float)]
            if values:
                out.setdefault(site, []).append((int(rec["round"]), sum(values) / len(values)))
    return out


def final_dsc(results_json: Path) -> dict[str, float]:
    """Per site, the final evaluation's DSC averaged over regions (a run's ``results.json``;
    {} when it is not there or holds no DSC)."""
    try:
        sites = json.loads(Path(results_json).read_text()).get("sites") or {}
    except (OSError, ValueError):
        return {}
    out = {}
    for site, block in sites.items():
        values = [v for v in ((block or {}).get("dsc") or {}).values() if v is not None]
        if values:
            out[site] = sum(values) / len(values)
    return out


VAL_LABEL = "validation DSC (%)"
FINAL_NOTE = "hollow: final test evaluation"


def plot_training_curves(
    records: list[dict[str, Any]],
    out: Path,
    title: str = "training curves",
    final: dict[str, float] | None = None,
) -> Path:
    """Training loss per site per round and, when the run evaluated periodically, the
    validation DSC per site per round (a second panel) as a PNG; ``final`` (per site, the
    final test DSC) is drawn hollow at the last round, where the periodic evaluation gives
    way to the final one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [("training loss", loss_history(records), False)]
    val = val_dsc_history(records)
    if val:
        panels.append((VAL_LABEL, val, True))
    last = max((int(r["round"]) for r in records), default=0) + 1
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels) + 1.2, 3.4), dpi=100, squeeze=False, sharex=True
    )
    for ax, (label, history, percent) in zip(axes[0], panels, strict=True):
        for site, points in history.items():
            xs, ys = zip(*points, strict=True)
            ys = [100 * y for y in ys] if percent else list(ys)
            (line,) = ax.plot([x + 1 for x in xs], ys, marker="o", markersize=3, label=site)
            if percent and final and site in final:
                _final_point(ax, xs[-1] + 1, ys[-1], last, 100 * final[site], line.get_color())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.8, last + 0.2)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_ylim(*((0, 100) if percent else (0, None)))
        ax.grid(alpha=0.3)
    legend = axes[0, -1].legend(
        title="site", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1)
    )
    if val and final:
        legend.set_title(f"site\n({FINAL_NOTE})", prop={"size": "small"})
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out


def _final_point(ax: Any, x0: int, y0: float, last: int, y: float, colour: str) -> None:
    """The final test evaluation at round ``last``: hollow, dotted from the last periodic
    point (another split, so not joined into the validation line)."""
    ax.plot([x0, last], [y0, y], ls=":", color=colour, lw=1)
    ax.plot([last], [y], marker="o", markersize=5, mfc="white", color=colour, ls="")


def plot_site_bars(section: Section, metric: str, out: Path) -> Path:
    """Grouped bars per site (and the average), one bar per row, one panel per region (stacked);
    error bars are the standard deviation over seeds when a row has several runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sites = [*section.sites, "Average"]
    n_rows, n_reg = len(section.rows), len(section.regions)
    scale = 1.0 if metric in DISTANCES else 100.0
    fig, axes = plt.subplots(  # regions stacked: many rows x sites stay within a page
        n_reg,
        1,
        figsize=(max(5.0, 0.8 + len(sites) * (0.3 + 0.18 * n_rows)) + 2.6, 0.4 + 2.8 * n_reg),
        dpi=100,
        squeeze=False,
    )
    width = 0.8 / n_rows
    x = np.arange(len(sites))
    labels = short_labels([row.label for row in section.rows])
    missed = [missed_regions(row.runs) if metric in DISTANCES else set() for row in section.rows]
    for ax, region in zip(axes[:, 0], section.regions, strict=True):
        for i, row in enumerate(section.rows):
            stats = [row.stat(metric, s, region) for s in sites]
            means = [scale * m for m, _ in stats]
            errs = [scale * (sd or 0.0) for _, sd in stats]
            at = x + (i - (n_rows - 1) / 2) * width
            ax.bar(
                at,
                means,
                width,
                label=labels[i],
                yerr=errs if len(row.runs) > 1 else None,
                capsize=2,
            )
            for xi, mean, s in zip(at, means, sites, strict=True):
                if (metric, s, region) in missed[i]:
                    ax.annotate(MISSED_MARK, (xi, mean), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(x, sites)
        ax.set_title(region, fontsize=9)
        ax.set_ylabel(f"{metric.upper()}{'' if metric in DISTANCES else ' (%)'}")
        ax.set_ylim(*((0, None) if metric in DISTANCES else (0, 100)))
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
    if any(missed):
        fig.text(0.01, -0.01, MISSED_NOTE, fontsize=8, ha="left", va="top")
    fig.suptitle(f"{section.task}: {metric.upper()} per site", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out


def plot_row_curves(section: Section, out: Path) -> Path:
    """Training loss (mean over sites) per round, one line per row (mean over its seeds), and
    DSC of the periodic evaluation (``eval.every``; mean over sites) when the runs made one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    def site_mean(history: dict[str, list[tuple[int, float]]]) -> dict[int, float]:
        per_round: dict[int, list[float]] = {}
        for points in history.values():
            for r, v in points:
                per_round.setdefault(r, []).append(v)
        return {r: sum(v) / len(v) for r, v in sorted(per_round.items())}

    panels = [("training loss\n(mean over sites)", loss_history, 1.0)]
    if any(val_dsc_history(run.rounds) for row in section.rows for run in row.runs):
        panels.append((f"{VAL_LABEL}\n(mean over sites)", val_dsc_history, 100.0))
    labels = short_labels([row.label for row in section.rows])
    last = max((int(r["round"]) + 1 for row in section.rows for run in row.runs
                for r in run.rounds), default=1)  # fmt: skip
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels) + 2.4, 3.6), dpi=100, squeeze=False, sharex=True
    )
    for ax, (label, history, scale) in zip(axes[0], panels, strict=True):
        for row, name in zip(section.rows, labels, strict=True):
            curves = [site_mean(history(run.rounds)) for run in row.runs]
            rounds = sorted(set().union(*curves))
            ys = [
                scale * sum(c[r] for c in curves if r in c) / sum(r in c for c in curves)
                for r in rounds
            ]
            (line,) = ax.plot([r + 1 for r in rounds], ys, marker="o", markersize=3, label=name)
            finals = [final_dsc(run.dir / "results.json") for run in row.runs]
            if scale == 100.0 and rounds and all(finals):
                y = 100 * sum(sum(f.values()) / len(f) for f in finals) / len(finals)
                _final_point(ax, rounds[-1] + 1, ys[-1], last, y, line.get_color())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.8, last + 0.2)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_ylim(*((0, 100) if scale == 100.0 else (0, None)))
        ax.grid(alpha=0.3)
    legend = axes[0, -1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
    if len(panels) > 1:
        legend.set_title(FINAL_NOTE, prop={"size": "small"})
    fig.suptitle(f"{section.task}: learning curves", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out
