"""Qualitative results: a few fixed test cases per site, their ground truth and each row's
prediction drawn as contours of the evaluation regions over the image (volumes: the slice
with the most foreground).

The cases are picked from the federation folder alone (never from a run), so every run of a
section is shown on the same cases, and a report made again later shows them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedseg.data.federation import read_npz, sample_ids
from fedseg.data.manifest import read_manifest
from fedseg.errors import FedsegError
from fedseg.reporting.compare import Section
from fedseg.reporting.results import fmt
from fedseg.reporting.runs import Run
from fedseg.reporting.stats import read_cases
from fedseg.reporting.strip import short_labels

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["CASES_PER_SITE", "Case", "pick_cases", "segmentation_figure"]

CASES_PER_SITE = 2
COLOURS = ("#00e5ff", "#ffea00", "#ff3df5", "#76ff03", "#ff9100", "#ffffff", "#2979ff")
"""Contour colour of the 1st, 2nd, ... evaluation region (bright on dark scans and photos)."""


@dataclass(frozen=True)
class Case:
    """One test case of a site, with its image ``[C, *S]`` and ground truth ``[*S]``."""

    site: str
    id: str
    image: np.ndarray
    mask: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.site}/{self.id}"


def pick_cases(root: Path, sites: list[str], split: str, per_site: int) -> list[Case]:
    """``per_site`` cases of ``split`` per site, fixed by the data: evenly spaced over the
    sorted ids of the cases whose ground truth holds foreground (all cases when none does)."""
    cases = []
    for site in sites:
        folder = root / "sites" / site / split
        arrays = {i: read_npz(folder / f"{i}.npz") for i in sample_ids(root, site, split)}
        ids = [i for i, a in arrays.items() if a["mask"].any()] or list(arrays)
        at = np.linspace(0, len(ids) - 1, min(per_site, len(ids))).round().astype(int)
        for i in sorted(set(at.tolist())):
            a = arrays[ids[i]]
            cases.append(Case(site, ids[i], a["image"].astype(np.float32), a["mask"]))
    return cases


def _predict(run: Run, site: str, images: np.ndarray) -> np.ndarray | None:
    """Label maps of the site's evaluation model of ``run`` (its export in ``models/``, else
    rebuilt from the checkpoint); None when neither is there."""
    from fedseg.export import load_exported
    from fedseg.inference import RunModels

    x = torch.from_numpy(images)
    try:
        model = load_exported(run.dir / "models" / f"{site}.pt")
    except FedsegError:
        try:
            model = RunModels(run.dir).site_model(site)
        except FedsegError:
            return None
    return model.label_maps(x, batch_size=len(x)).numpy()


def _slice(case: Case) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The image (H, W[, 3]) and mask (H, W) to draw, and the slice index of a volume."""
    image, mask, z = case.image, case.mask, None
    if mask.ndim == 3:
        z = int(np.argmax((mask > 0).reshape(mask.shape[0], -1).sum(1)))
        image, mask = image[:, z], mask[z]
    if image.shape[0] == 3:
        return np.clip(image.transpose(1, 2, 0), 0, 1), mask, z
    return image[0], mask, z


def segmentation_figure(
    section: Section, out: Path, per_site: int = CASES_PER_SITE
) -> tuple[Path, list[str]] | None:
    """Draw the section's qualitative figure into ``out`` (PNG): one line per case (site and
    id), columns image, ground truth and each row's prediction (its first run) with that
    run's recorded DSC of the case (``cases.csv``) under it. Returns the
    path and the case names, or None when the federation folder of the runs is not here."""
    first = section.rows[0].runs[0]
    root = Path(str((first.config.get("data") or {}).get("root", "")))
    try:
        manifest = read_manifest(root)
        split = str((first.config.get("eval") or {}).get("split", "test"))
        cases = pick_cases(root, section.sites, split, per_site)
    except FedsegError:
        return None
    if not cases:
        return None
    runs = [row.runs[0] for row in section.rows]
    preds: dict[tuple[int, str], np.ndarray | None] = {}
    for j, run in enumerate(runs):
        for site in section.sites:
            mine = [c for c in cases if c.site == site]
            if mine:
                maps = _predict(run, site, np.stack([c.image for c in mine]))
                for k, c in enumerate(mine):
                    preds[j, c.name] = None if maps is None else maps[k]
    labels = ["image", "ground truth", *short_labels([row.label for row in section.rows], 24)]
    labels[2:] = [
        f"{lab}\n(seed {run.config.get('seed', '?')})"
        for lab, run in zip(labels[2:], runs, strict=True)
    ]
    scores = {
        (j, name): text for j, run in enumerate(runs) for name, text in _case_dsc(run).items()
    }
    _draw(cases, labels, preds, manifest.regions, out, scores)
    return out, [c.name for c in cases]


def _case_dsc(run: Run) -> dict[str, str]:
    """Per case (``site/id``), the run's recorded DSC of each region (``cases.csv``), e.g.
    ``DSC cup 41.2, disc 80.5``; {} without a readable ``cases.csv``."""
    try:
        rows = read_cases(run.dir / "cases.csv")
    except FedsegError:
        return {}
    per_case: dict[str, list[str]] = {}
    for site, cid, region, metric, value in rows:
        if metric == "dsc":
            per_case.setdefault(f"{site}/{cid}", []).append(f"{region} {fmt(value, metric)}")
    return {name: "DSC " + ", ".join(parts) for name, parts in per_case.items()}


def _draw(
    cases: list[Case],
    labels: list[str],
    preds: dict[tuple[int, str], np.ndarray | None],
    regions: dict[str, list[int]],
    out: Path,
    scores: dict[tuple[int, str], str],
) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    size, legend = 1.9, 0.5
    fig, axes = plt.subplots(
        len(cases),
        len(labels),
        figsize=(size * len(labels), size * len(cases) + legend + 0.4),
        squeeze=False,
    )
    for r, case in enumerate(cases):
        image, truth, z = _slice(case)
        masks = [None, truth] + [
            None if (m := preds[j, case.name]) is None else (m if z is None else m[z])
            for j in range(len(labels) - 2)
        ]
        for c, (ax, mask) in enumerate(zip(axes[r], masks, strict=True)):
            ax.imshow(image, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if mask is not None:
                _contours(ax, mask, regions)
            if c >= 2 and (c - 2, case.name) in scores:
                ax.text(
                    0.5,
                    0.02,
                    textwrap.fill(scores[c - 2, case.name], 28),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="white",
                    transform=ax.transAxes,
                    bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.5, "linewidth": 0},
                )
            elif c >= 2:
                ax.text(
                    0.5,
                    0.5,
                    "no model",
                    ha="center",
                    va="center",
                    color="red",
                    transform=ax.transAxes,
                )
            if r == 0:
                lines = labels[c].splitlines()
                ax.set_title(
                    "\n".join(textwrap.fill(x, 24, break_long_words=False) for x in lines),
                    fontsize=8,
                )
        where = f"\nslice z={z}" if z is not None else ""
        axes[r][0].set_ylabel(f"{case.name}{where}", fontsize=8)
    handles = [
        Line2D([], [], color=COLOURS[k % len(COLOURS)], lw=2, label=name)
        for k, name in enumerate(regions)
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, legend / (size * len(cases) + legend + 0.4), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _contours(ax: Axes, mask: np.ndarray, regions: dict[str, list[int]]) -> None:
    """The outline of each region (its classes joined) in the region's colour."""
    for k, classes in enumerate(regions.values()):
        hit = np.isin(mask, classes)
        if hit.any():
            colour = COLOURS[k % len(COLOURS)]
            ax.contour(hit.astype(float), levels=[0.5], colors=[colour], linewidths=1.3)
