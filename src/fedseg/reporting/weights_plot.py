"""Aggregation-weight trajectories (``server.aaw_weights`` in ``rounds.jsonl``) as a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["load_weight_history", "plot_weights", "weights_figure"]

KEY = "aaw_weights"


def load_weight_history(rounds: Path | list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per site, ``(round, weight)`` for every round whose server metrics hold ``aaw_weights``.

    Args:
        rounds: a run directory, its ``rounds.jsonl``, or the already parsed records.

    Raises:
        ConfigError: the file is missing or no round records adaptive weights.
    """
    records = rounds if isinstance(rounds, list) else _read(Path(rounds))
    history: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        weights = (rec.get("server") or {}).get(KEY)
        for site, w in (weights or {}).items():
            history.setdefault(site, []).append((int(rec["round"]), float(w)))
    if not history:
        raise ConfigError(
            f"no round records server metric {KEY!r}; was the run made with an *_aaw method?"
        )
    return history


def _read(path: Path) -> list[dict[str, Any]]:
    file = path / "rounds.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{file} does not exist (expected a run directory or rounds.jsonl)")
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def plot_weights(
    rounds: Path | list[dict[str, Any]],
    out: Path,
    title: str = "AAW aggregation weights",
    sizes: dict[str, int] | None = None,
) -> Path:
    """Save :func:`weights_figure` as a PNG at ``out``."""
    import matplotlib.pyplot as plt

    fig = weights_figure(rounds, title, sizes)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")  # keeps the legend right of the axes
    plt.close(fig)
    return out


def weights_figure(
    rounds: Path | list[dict[str, Any]],
    title: str = "AAW aggregation weights",
    sizes: dict[str, int] | None = None,
) -> Figure:
    """One line per site (the weight used in each round's aggregation); the legend sits
    right of the axes and names each site's training-set size from ``sizes``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    history = load_weight_history(rounds)
    sizes = sizes or {}
    fig, ax = plt.subplots(figsize=(7.6, 4.0), dpi=120)
    for site, points in history.items():
        xs, ys = zip(*points, strict=True)
        label = f"{site} (n={sizes[site]})" if site in sizes else site
        ax.plot([x + 1 for x in xs], ys, marker="o", markersize=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("aggregation weight")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(
        title="site (training samples)" if sizes else "site",
        fontsize="small",
        title_fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.02, 1),
        borderaxespad=0,
    )
    fig.tight_layout()
    return fig
