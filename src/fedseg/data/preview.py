"""PNG overlays of a federation (``fedseg data preview``): image | full mask | weak label."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedseg.data.federation import FederatedDataset
from fedseg.data.manifest import SPLITS
from fedseg.errors import DataError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["preview", "site_figure"]

BACKGROUND = np.array([0.1, 0.2, 0.5])
"""Overlay colour of labeled background (class 0)."""


def preview(
    root: str | Path,
    out: str | Path | None = None,
    *,
    n: int = 4,
    split: str = "train",
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Save one PNG per site (``<out>/<site>.png``, default ``<root>/preview``) showing the
    first ``n`` samples of ``split``: image, full mask and weak label overlays (the weak column
    is left out for fully annotated sites), with a colour legend of the classes. A box site
    gets its boxes drawn on the image and, beside them, the label they were converted to
    for training. 3D samples show their middle slice (its 0-based index ``z`` is in the
    panel title).

    Returns:
        The written PNG paths.
    """
    import matplotlib.pyplot as plt

    if split not in SPLITS:
        raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
    fed = FederatedDataset.open(root)
    folder = Path(out) if out is not None else fed.root / "preview"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for done, site in enumerate(fed.manifest.sites, start=1):
        fig = site_figure(fed, site.name, split, n)
        path = folder / f"{site.name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        if progress is not None:
            progress(done, len(fed.manifest.sites))
    return written


def site_figure(fed: FederatedDataset, site_name: str, split: str, n: int) -> Figure:
    """The preview figure of one site (see :func:`preview`): a row per sample, a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = fed.manifest
    site = next(s for s in m.sites if s.name == site_name)
    colours = _palette(m.num_classes)
    data = fed.load(site.name, split, "weak" if site.annotation != "full" else "full")
    count = min(n, len(data))
    titles = _columns(site.annotation, m.box_conversion)
    cols = len(titles)
    fig, axes = plt.subplots(
        max(count, 1), cols, figsize=(2.2 * cols, 2.2 * max(count, 1) + 0.35), squeeze=False
    )
    for ax in axes.ravel():
        ax.axis("off")
    for row in range(count):
        image = _display_image(data.images[row].numpy())
        mask = data.masks[row].numpy()
        where = f" (z={mask.shape[0] // 2} of {mask.shape[0]})" if mask.ndim == 3 else ""
        panels = [image, _overlay(image, _mid(mask), colours)]
        if site.annotation in ("box", "rotated_box"):
            panels.append(image)
            _draw_boxes(axes[row, 2], _mid(mask), site.annotation == "rotated_box", colours)
        if cols > 2:
            panels.append(_overlay(image, _mid(data.labels[row].numpy()), colours))
        for col, shown in enumerate(panels):
            axes[row, col].imshow(shown)
            title = f"{data.ids[row]} {titles[col]}{where}" if col == 0 else titles[col]
            axes[row, col].set_title(title, fontsize=7)
    if count == 0:
        axes[0, 0].set_title(f"{site.name}: no {split} samples", fontsize=8)
    fig.suptitle(f"{m.task} site {site.name} ({site.annotation})", fontsize=9)
    fig.legend(
        handles=_legend(m.class_names, colours),
        loc="lower center",
        ncol=min(len(m.class_names) + 1, 4),
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.3 / (2.2 * max(count, 1) + 0.35), 1, 1))
    return fig


def _columns(annotation: str, box_conversion: str) -> list[str]:
    """Panel titles of a site's row: image, mask, then what the site is annotated with."""
    if annotation == "full":
        return ["image", "full mask"]
    if annotation in ("box", "rotated_box"):
        kind = "rotated boxes" if annotation == "rotated_box" else "boxes"
        return ["image", "full mask", f"{kind} (annotation)", f"{box_conversion} from {kind}"]
    return ["image", "full mask", f"{annotation} (annotation)"]


def _draw_boxes(ax: Any, mask: np.ndarray, rotated: bool, colours: np.ndarray) -> None:
    """Outline each object's (rotated) box of ``mask`` in its class colour."""
    import cv2
    from matplotlib.patches import Polygon

    from fedseg.data.weak import WeakLabelParams
    from fedseg.data.weak.boxes import boxes_of

    for box in boxes_of(
        mask, rotated=rotated, min_pixels=WeakLabelParams().min_region_pixels(mask.shape)
    ):
        corners = cv2.boxPoints(box.scaled(1.0))  # pixel edges, as imshow draws pixels
        ax.add_patch(Polygon(corners, closed=True, fill=False, lw=1.5, ec=colours[box.cls]))


def _legend(class_names: list[str], colours: np.ndarray) -> list[Any]:
    """Legend patches: one per class (background as drawn where labeled) and unlabeled."""
    from matplotlib.patches import Patch

    shown = [BACKGROUND, *colours[1:]]
    return [
        *(
            Patch(fc=c, ec="k", lw=0.5, label=name)
            for name, c in zip(class_names, shown, strict=True)
        ),
        Patch(fc="none", ec="k", lw=0.5, label="unlabeled (image only)"),
    ]


def _mid(array: np.ndarray) -> np.ndarray:
    """The middle slice along the first spatial axis of a 3D array, a 2D array unchanged."""
    return array[array.shape[0] // 2] if array.ndim == 3 else array


def _display_image(image: np.ndarray) -> np.ndarray:
    """(C, *spatial) -> (H, W, 3) in [0, 1] (first channel as grey unless RGB)."""
    planes = np.stack([_mid(c) for c in image])
    rgb = planes[:3] if planes.shape[0] == 3 else np.repeat(planes[:1], 3, axis=0)
    lo, hi = float(rgb.min()), float(rgb.max())
    return np.moveaxis((rgb - lo) / max(hi - lo, 1e-6), 0, -1)


def _palette(num_classes: int) -> np.ndarray:
    from matplotlib import colormaps

    return np.asarray([colormaps["tab10"](i % 10)[:3] for i in range(num_classes)])


def _overlay(image: np.ndarray, label: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """Blend class colours over ``image``; background is drawn dark blue-grey only where it
    is labeled, and unlabeled pixels keep the image."""
    out = image.copy()
    for c, colour in enumerate(colours):
        where = label == c
        out[where] = 0.35 * out[where] + 0.65 * (colour if c else BACKGROUND)
    return out
