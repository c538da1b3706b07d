"""PNG overlays of a federation (``fedseg data preview``): image | full mask | weak label."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedseg.data.federation import FederatedDataset
from fedseg.data.manifest import SPLITS
from fedseg.errors import DataError

__all__ = ["preview"]


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
    is left out for fully annotated sites). 3D samples show their middle slice.

    Returns:
        The written PNG paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if split not in SPLITS:
        raise DataError(f"split must be one of {list(SPLITS)}, got {split!r}")
    fed = FederatedDataset.open(root)
    m = fed.manifest
    folder = Path(out) if out is not None else fed.root / "preview"
    folder.mkdir(parents=True, exist_ok=True)
    colours = _palette(m.num_classes)
    written = []
    for done, site in enumerate(m.sites, start=1):
        weak = site.annotation != "full"
        data = fed.load(site.name, split, "weak" if weak else "full")
        count = min(n, len(data))
        cols = 3 if weak else 2
        fig, axes = plt.subplots(
            max(count, 1), cols, figsize=(2.2 * cols, 2.2 * max(count, 1)), squeeze=False
        )
        for ax in axes.ravel():
            ax.axis("off")
        for row in range(count):
            image = _display_image(data.images[row].numpy())
            panels = [
                ("image", None),
                ("mask", data.masks[row]),
                (site.annotation, data.labels[row]),
            ]
            for col, (title, label) in enumerate(panels[:cols]):
                shown = image if label is None else _overlay(image, _mid(label.numpy()), colours)
                axes[row, col].imshow(shown)
                axes[row, col].set_title(
                    f"{data.ids[row]} {title}" if col == 0 else title, fontsize=7
                )
        if count == 0:
            axes[0, 0].set_title(f"{site.name}: no {split} samples", fontsize=8)
        fig.suptitle(f"{m.task} site {site.name} ({site.annotation})", fontsize=9)
        fig.tight_layout()
        path = folder / f"{site.name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
        if progress is not None:
            progress(done, len(m.sites))
    return written


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
        out[where] = 0.35 * out[where] + 0.65 * (colour if c else np.array([0.1, 0.2, 0.5]))
    return out
