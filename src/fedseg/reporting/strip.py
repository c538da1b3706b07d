"""Strip plots of per-case metrics: one strip of dots per row, its median marked."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["short_labels", "strip_figure"]

_SETTING = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*\.)+(\w+=)")


def short_labels(labels: Sequence[str], width: int = 30) -> list[str]:
    """Row labels for figures: the config name dropped where every row shares it (the
    settings in brackets then tell the rows apart), ``method.name=X`` as ``X``, each other
    setting by its last key part (``data.labels=full`` -> ``labels=full``), wrapped at
    ``width`` characters."""
    names = {lab.split(" (", 1)[0] for lab in labels}
    out = []
    for lab in labels:
        name, _, rest = lab.partition(" (")
        text = rest.removesuffix(")") if len(names) == 1 and rest else lab
        text = _SETTING.sub(r"\1", re.sub(r"\bmethod\.name=", "", text))
        out.append(
            textwrap.fill(text or name, width, break_long_words=False, break_on_hyphens=False)
        )
    return out


def strip_figure(
    labels: Sequence[str],
    panels: Mapping[str, Sequence[Sequence[float]]],
    title: str,
    path: Path,
) -> Path:
    """One panel per metric (``panels``: metric label -> per-row case values, in ``labels``
    order): each case a jittered dot, each row's median a bar; rows labelled by
    :func:`short_labels`; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    shown = short_labels(labels)
    lines = max(lab.count("\n") + 1 for lab in shown)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(4.2 * len(panels), (0.3 + 0.17 * lines) * len(labels) + 1.6),
        squeeze=False,
    )
    for ax, (metric, rows) in zip(axes[0], panels.items(), strict=True):
        for i, values in enumerate(rows):
            v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
            y = i + rng.uniform(-0.18, 0.18, v.size)
            ax.scatter(v, y, s=7, alpha=0.45, color="tab:blue", linewidths=0)
            if v.size:
                ax.plot([np.median(v)] * 2, [i - 0.3, i + 0.3], color="black", lw=2)
        ax.set_yticks(range(len(labels)), shown if ax is axes[0][0] else [""] * len(labels))
        ax.tick_params(axis="y", labelsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"{metric} per test case (mean over seeds)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the row labels widen the figure
    plt.close(fig)
    return path
