"""Figures a run directory gets at the end, chosen by what its ``rounds.jsonl`` records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.reporting.affinity import plot_affinity
from fedseg.reporting.runs import read_rounds, site_facts
from fedseg.reporting.weights_plot import plot_weights

if TYPE_CHECKING:
    from fedseg.reporting.compare import Section

__all__ = [
    "PLOTS",
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
        out.append(plot_training_curves(records, run_dir / "training_curves.png"))
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


def plot_training_curves(
    records: list[dict[str, Any]], out: Path, title: str = "training curves"
) -> Path:
    """Training loss per site per round and, when the run evaluated periodically, the
    DSC per site per round (a second panel) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [("training loss", loss_history(records), False)]
    val = val_dsc_history(records)
    if val:
        panels.append(("DSC at periodic evaluation (%)", val, True))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels) + 1.2, 3.4), dpi=100, squeeze=False, sharex=True
    )
    for ax, (label, history, percent) in zip(axes[0], panels, strict=True):
        for site, points in history.items():
            xs, ys = zip(*points, strict=True)
            ys = [100 * y for y in ys] if percent else list(ys)
            ax.plot([x + 1 for x in xs], ys, marker="o", markersize=3, label=site)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_ylim(*((0, 100) if percent else (0, None)))
        ax.grid(alpha=0.3)
    axes[0, -1].legend(title="site", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out


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
    for ax, region in zip(axes[:, 0], section.regions, strict=True):
        for i, row in enumerate(section.rows):
            stats = [row.stat(metric, s, region) for s in sites]
            means = [scale * m for m, _ in stats]
            errs = [scale * (sd or 0.0) for _, sd in stats]
            ax.bar(
                x + (i - (n_rows - 1) / 2) * width,
                means,
                width,
                label=row.label,
                yerr=errs if len(row.runs) > 1 else None,
                capsize=2,
            )
        ax.set_xticks(x, sites)
        ax.set_title(region, fontsize=9)
        ax.set_ylabel(f"{metric.upper()}{'' if metric in DISTANCES else ' (%)'}")
        ax.set_ylim(*((0, None) if metric in DISTANCES else (0, 100)))
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
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

    panels = [("training loss (mean over sites)", loss_history, 1.0)]
    if any(val_dsc_history(run.rounds) for row in section.rows for run in row.runs):
        panels.append(("DSC at periodic evaluation (%, mean over sites)", val_dsc_history, 100.0))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels) + 2.4, 3.4), dpi=100, squeeze=False, sharex=True
    )
    for ax, (label, history, scale) in zip(axes[0], panels, strict=True):
        for row in section.rows:
            curves = [site_mean(history(run.rounds)) for run in row.runs]
            rounds = sorted(set().union(*curves))
            ys = [
                scale * sum(c[r] for c in curves if r in c) / sum(r in c for c in curves)
                for r in rounds
            ]
            ax.plot([r + 1 for r in rounds], ys, marker="o", markersize=3, label=row.label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_ylim(*((0, 100) if scale == 100.0 else (0, None)))
        ax.grid(alpha=0.3)
    axes[0, -1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(f"{section.task}: learning curves", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out
