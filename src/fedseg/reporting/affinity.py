"""Heat map of FedLPPA's inter-site prompt affinity matrix (paper Fig. 10, Eqs. 7-8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.errors import ConfigError
from fedseg.reporting.runs import site_facts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["affinity_figure", "affinity_table", "last_affinity", "plot_affinity"]


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
            f"{path}: no round has server metrics 'affinity' (a FedLPPA run with tdf: true "
            "and at most method.log_matrices_up_to sites)"
        )
    matrix = found["server"]["affinity"]
    names = found["server"].get("affinity_sites") or [str(i) for i in range(len(matrix))]
    return int(found["round"]), matrix, list(names)


def plot_affinity(run_dir: Path, out: Path | None = None) -> Path:
    """Render the last round's affinity matrix of ``run_dir`` to a PNG (default
    ``run_dir/affinity.png``) and return its path."""
    import matplotlib.pyplot as plt

    fig = affinity_figure(run_dir)
    target = Path(out) if out is not None else Path(run_dir) / "affinity.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def affinity_figure(run_dir: Path) -> Figure:
    """The heat map of the last round's affinity matrix. Colours span the matrix's
    off-diagonal value range (the diagonal, a site's affinity to itself, would flatten the
    scale); the axes name each site and, when its federation is readable, its annotation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rnd, matrix, names = last_affinity(run_dir)
    n = len(matrix)
    facts = site_facts(run_dir)
    labels = [f"{s}\n({facts[s].annotation})" if s in facts else s for s in names]
    off = [matrix[i][j] for i in range(n) for j in range(n) if i != j] or [0.0, 1.0]
    lo, hi = min(off), max(off)
    if hi - lo < 1e-6:
        lo, hi = lo - 0.5e-2, hi + 0.5e-2
    fig, ax = plt.subplots(figsize=(2.4 + 0.9 * n, 1.6 + 0.9 * n))
    im = ax.imshow(matrix, vmin=lo, vmax=hi, cmap="viridis")
    ax.set_xticks(range(n), labels, fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("site")
    ax.set_ylabel("site")
    for i in range(n):
        for j in range(n):
            v = matrix[i][j]
            shade = (min(max(v, lo), hi) - lo) / (hi - lo)
            ax.text(
                j,
                i,
                f"{v:.3f}",
                ha="center",
                va="center",
                fontsize=8,
                color="w" if shade < 0.6 else "k",
            )
    ax.set_title(
        f"prompt affinity after round {rnd + 1}\n(colour range {lo:.3f} to {hi:.3f})", fontsize=9
    )
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=8)
    fig.tight_layout()
    return fig


def affinity_table(run_dir: Path) -> str:
    """The last recorded affinity matrix of a run as a Markdown table."""
    rnd, matrix, names = last_affinity(run_dir)
    head = "| | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1)
    rows = [
        f"| {n} | " + " | ".join(f"{v:.2f}" for v in row) + " |"
        for n, row in zip(names, matrix, strict=True)
    ]
    return f"Prompt affinity after round {rnd + 1}:\n\n{head}\n" + "\n".join(rows) + "\n"
