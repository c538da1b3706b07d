"""Strip plots of per-case metrics: one strip of dots per row, its median marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["strip_figure"]


def strip_figure(
    labels: Sequence[str],
    panels: Mapping[str, Sequence[Sequence[float]]],
    title: str,
    path: Path,
) -> Path:
    """One panel per metric (``panels``: metric label -> per-row case values, in ``labels``
    order): each case a jittered dot, each row's median a bar; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels), 0.45 * len(labels) + 1.6), squeeze=False
    )
    for ax, (metric, rows) in zip(axes[0], panels.items(), strict=True):
        for i, values in enumerate(rows):
            v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
            y = i + rng.uniform(-0.18, 0.18, v.size)
            ax.scatter(v, y, s=7, alpha=0.45, color="tab:blue", linewidths=0)
            if v.size:
                ax.plot([np.median(v)] * 2, [i - 0.3, i + 0.3], color="black", lw=2)
        ax.set_yticks(range(len(labels)), labels if ax is axes[0][0] else [""] * len(labels))
        ax.invert_yaxis()
        ax.set_xlabel(f"{metric} per test case (mean over seeds)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
