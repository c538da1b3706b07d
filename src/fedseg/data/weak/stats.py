"""How much of each class a weak label marks, and how often it is wrong.

``label_counts(mask, label, num_classes)`` counts one sample; counts add up over samples.
``synthetic_stats(task, annotations)`` draws masks of a registered synthetic task (sites in
turn, their own styles) and counts every annotation type on the same masks;
``stats_table`` renders the result as the markdown table of docs/weak_labels.md
(``benchmarks/weak_label_stats.py`` prints it for every 2D task).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedseg.data.manifest import IGNORE_INDEX, Annotation
from fedseg.data.weak.generate import weak_label
from fedseg.data.weak.params import WeakLabelParams
from fedseg.data.weak.sparse import meaningful_regions

__all__ = ["LabelCounts", "label_counts", "stats_table", "synthetic_stats"]


@dataclass(frozen=True)
class LabelCounts:
    """Pixel and region counts per class (index = class) over one or more samples."""

    class_pixels: np.ndarray
    """Pixels of class c in the full mask."""
    labelled: np.ndarray
    """Pixels of class c (in the mask) that carry any label."""
    correct: np.ndarray
    """Pixels of class c labelled c."""
    labelled_as: np.ndarray
    """Pixels labelled c (whatever the mask says)."""
    regions: np.ndarray
    """Meaningful regions of class c (``meaningful_regions``)."""
    regions_hit: np.ndarray
    """Of those, regions holding at least one pixel labelled c."""
    bg_near: int = 0
    """Background pixels inside the foreground's bounding box (among the structures)."""
    bg_near_labelled: int = 0
    """Of those, pixels labelled background."""

    def __add__(self, other: LabelCounts) -> LabelCounts:
        return LabelCounts(
            *(getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__)
        )

    @property
    def labelled_fraction(self) -> np.ndarray:
        """Per class: fraction of its pixels labelled with it."""
        return self.correct / np.maximum(self.class_pixels, 1)

    @property
    def bg_near_fraction(self) -> float:
        """Fraction of the background inside the foreground's bounding box labelled."""
        return self.bg_near_labelled / max(self.bg_near, 1)

    @property
    def error_rate(self) -> float:
        """Fraction of labelled pixels whose label differs from the mask."""
        total = int(self.labelled_as.sum())
        return float(total - self.correct.sum()) / max(total, 1)

    @property
    def class_error_rate(self) -> np.ndarray:
        """Per class: fraction of the pixels labelled c that are not c in the mask."""
        return 1 - self.correct / np.maximum(self.labelled_as, 1)

    @property
    def region_coverage(self) -> np.ndarray:
        """Per class: fraction of its meaningful regions that hold a correct label."""
        return self.regions_hit / np.maximum(self.regions, 1)


def label_counts(
    mask: np.ndarray, label: np.ndarray, num_classes: int, params: WeakLabelParams | None = None
) -> LabelCounts:
    """Counts of one 2D sample (``label`` uses ``IGNORE_INDEX`` for unlabeled pixels)."""
    if mask.shape != label.shape or mask.ndim != 2:
        raise ValueError(
            f"mask and label must be 2D of one shape, got {mask.shape} and {label.shape}"
        )
    p = params or WeakLabelParams()
    on = label != IGNORE_INDEX
    counts = lambda a: np.bincount(a.ravel(), minlength=num_classes)[:num_classes]  # noqa: E731
    regions = np.zeros(num_classes, np.int64)
    hit = np.zeros(num_classes, np.int64)
    for c in range(num_classes):
        found = meaningful_regions(mask, c, p.min_region_pixels(mask.shape))
        regions[c] = len(found)
        hit[c] = sum(bool((label[r] == c).any()) for r in found)
    ys, xs = np.nonzero(mask > 0)
    near = np.zeros(mask.shape, bool)
    if len(ys):
        near[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1] = True
    near &= mask == 0
    return LabelCounts(
        class_pixels=counts(mask.astype(np.int64)),
        labelled=counts(mask[on].astype(np.int64)),
        correct=counts(mask[on & (label == mask)].astype(np.int64)),
        labelled_as=counts(label[on].astype(np.int64)),
        regions=regions,
        regions_hit=hit,
        bg_near=int(near.sum()),
        bg_near_labelled=int((near & (label == 0)).sum()),
    )


def synthetic_stats(
    task: str,
    annotations: Sequence[Annotation],
    *,
    size: int = 64,
    per_site: int = 8,
    seed: int = 0,
    foreground: Sequence[int] | None = None,
    params: WeakLabelParams | None = None,
) -> dict[str, LabelCounts]:
    """Counts per annotation type on ``per_site`` masks of each of the task's default sites.

    Boxes are converted as the task converts them (``box_conversion``). Every type labels the
    same masks, each with its own generator seeded by (seed, site, sample). ``foreground``
    keeps only these classes (relabelled 1, 2, ...; the others become background), e.g.
    ``(2,)`` turns the brain task into binary white matter.
    """
    from fedseg.data.synth import SYNTH_TASKS
    from fedseg.data.synth.base import site_style

    t = SYNTH_TASKS.get(task)
    if len(t.spatial_shape(size)) != 2:
        raise ValueError(f"weak-label statistics are 2D; task {task!r} is not")
    out: dict[str, LabelCounts] = {}
    keep = list(foreground) if foreground is not None else list(range(1, len(t.class_names)))
    lut = np.zeros(len(t.class_names), np.uint8)
    lut[keep] = np.arange(1, len(keep) + 1)
    n = len(keep) + 1
    for site in range(len(t.annotations)):
        rng = np.random.default_rng([seed, site])
        style = site_style(t.styles, site)
        for k in range(per_site):
            mask = lut[t.sample(style, size, rng)[1]]
            for a in annotations:
                label = weak_label(
                    mask,
                    a,
                    np.random.default_rng([seed, site, k]),
                    box_conversion=t.box_conversion,
                    params=params,
                )
                c = label_counts(mask, label, n, params)
                out[a] = out[a] + c if a in out else c
    return out


def stats_table(
    rows: Mapping[str, Mapping[str, LabelCounts]], class_names: Mapping[str, Sequence[str]]
) -> str:
    """Markdown table: per task and type, each class's labelled %, the labelled share of the
    background inside the foreground's bounding box, the error %, and the share of meaningful
    regions that got a correct label."""
    lines = [
        "| task | type | labelled % per class | bg in fg box % | error % (per class) "
        "| regions labelled % |",
        "|---|---|---|---|---|---|",
    ]
    for task, by_type in rows.items():
        names = class_names[task]
        for a, c in by_type.items():
            frac = ", ".join(
                f"{nm} {100 * v:.1f}" for nm, v in zip(names, c.labelled_fraction, strict=True)
            )
            err = ", ".join(
                f"{nm} {100 * v:.1f}" for nm, v in zip(names, c.class_error_rate, strict=True)
            )
            cov = 100 * c.regions_hit.sum() / max(int(c.regions.sum()), 1)
            near, e = 100 * c.bg_near_fraction, 100 * c.error_rate
            lines.append(f"| {task} | {a} | {frac} | {near:.1f} | {e:.1f} ({err}) | {cov:.0f} |")
    return "\n".join(lines)
