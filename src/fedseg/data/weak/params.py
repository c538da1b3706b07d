"""Parameters of the weak-label algorithms; lengths are fractions of the image side."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WeakLabelParams"]


@dataclass(frozen=True, kw_only=True)
class WeakLabelParams:
    """Knobs of point, scribble, scribble2, block and box synthesis (docs/weak_labels.md
    explains each rule and its source).

    Every length is a fraction of ``s = min(H, W)`` and rounds to at least one pixel.
    """

    min_region: float = 1e-3
    """A connected region of a class is *meaningful* (an annotator labels it) when it holds at
    least ``max(4, min_region * H * W)`` pixels; a class whose regions are all smaller still
    gets its largest region labeled."""
    brush: float = 1 / 96
    """Brush radius of scribbles and of the Gaussian point stamp."""
    point_shrink: tuple[float, float] = (0.3, 0.6)
    """Range of the ratio by which the maximal inscribed rectangle is shrunk before its side
    midpoints become points."""
    point_bg_margin: float = 0.25
    """Background points are searched near the structures: inside the foreground's bounding
    box grown by this fraction of its size on every side (when that part of a background
    region is meaningful)."""
    scribble_margin: float = 1 / 64
    """Erosion before skeletonisation: a scribble keeps this distance from its region's
    boundary (at most half the region's maximal depth)."""
    scribble_prune: float = 1 / 32
    """Skeleton spurs shorter than this are removed and stroke ends pulled back by it."""
    elastic_alpha: float = 0.03
    """scribble2: maximum elastic displacement per axis."""
    elastic_sigma: float = 0.1
    """scribble2: smoothness (Gaussian sigma) of the displacement field."""
    erase_count: tuple[int, int] = (2, 4)
    """scribble2: range of the number of erased discs."""
    erase_radius: float = 0.08
    """scribble2: radius of each erased disc."""
    block_band: float = 0.05
    """block: width of the unlabeled band on each side of every boundary (at most half of a
    component's maximal depth, so every component keeps labels)."""
    box_fg_shrink: float = 0.6
    """box -> block: the box's inscribed ellipse shrunk by this factor is labeled foreground."""
    box_ignore_grow: float = 1.2
    """box -> block: an ellipse this much larger around a nested box is left unlabeled."""
    box_bg_margin: float = 0.15
    """box conversions: background starts this fraction of the box size outside the box."""
    box_ring: float = 0.5
    """box -> scribble: ring (ellipse outline) at this fraction of an innermost box."""

    def __post_init__(self) -> None:
        lo, hi = self.point_shrink
        if not 0 <= lo < hi:
            raise ValueError(
                f"WeakLabelParams.point_shrink must satisfy 0 <= lo < hi, got {lo, hi}"
            )
        if not 0 <= self.min_region < 1:
            raise ValueError(f"WeakLabelParams.min_region must be in [0, 1), got {self.min_region}")
        if not 0 < self.box_fg_shrink < 1 < self.box_ignore_grow:
            raise ValueError(
                "WeakLabelParams needs 0 < box_fg_shrink < 1 < box_ignore_grow, got "
                f"{self.box_fg_shrink} and {self.box_ignore_grow}"
            )
        lo, hi = self.erase_count
        if not 0 <= lo <= hi:
            raise ValueError(
                f"WeakLabelParams.erase_count must satisfy 0 <= lo <= hi, got {lo, hi}"
            )

    def pixels(self, fraction: float, shape: tuple[int, ...]) -> int:
        """``fraction`` of ``min(shape)`` in whole pixels (at least 1)."""
        return max(1, round(fraction * min(shape)))

    def min_region_pixels(self, shape: tuple[int, ...]) -> int:
        """Smallest meaningful region in pixels: ``max(4, min_region * H * W)``."""
        area = 1
        for s in shape:
            area *= s
        return max(4, round(self.min_region * area))
