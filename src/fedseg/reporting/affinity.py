"""Heat map of FedLPPA's inter-site prompt affinity matrix (paper Fig. 10, Eqs. 7-8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedseg.errors import ConfigError

__all__ = ["last_affinity", "plot_affinity"]


def last_affinity(run_dir: Path) -> tuple[int, list[list[float]], list[str]]:
    """``(round, matrix, site names)`` of the last round whose server metrics hold one."""
    path = Path(run_dir) / "rounds.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no rounds.jsonl")
    found: dict[str, Any] | None = None
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "affinity" in rec.get("server", {}):
                found = rec
    if found is None:
        raise ConfigError(
            f"{path}: no round has server metrics 'affinity' (a FedLPPA run with tdf: true)"
        )
    matrix = found["server"]["affinity"]
    names = found["server"].get("affinity_sites") or [str(i) for i in range(len(matrix))]
    return int(found["round"]), matrix, list(names)


def plot_affinity(run_dir: Path, out: Path | None = None) -> Path:
    """Render the last round's affinity matrix of ``run_dir`` to a PNG (default
    ``run_dir/affinity.png``) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rnd, matrix, names = last_affinity(run_dir)
    n = len(matrix)
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * n, 0.6 + 0.8 * n))
    im = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(n), names, rotation=45, ha="right")
    ax.set_yticks(range(n), names)
    for i in range(n):
        for j in range(n):
            v = matrix[i][j]
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k")
    ax.set_title(f"prompt affinity, round {rnd + 1}")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    target = Path(out) if out is not None else Path(run_dir) / "affinity.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
