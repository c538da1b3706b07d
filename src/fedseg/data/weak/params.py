"""Parameters of the weak-label algorithms; lengths are fractions of the image side."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WeakLabelParams"]


@dataclass(frozen=True, kw_only=True)
class WeakLabelParams:
    """Knobs of point, scribble, scribble2, block and box synthesis (docs/data.md explains each).

    Every length is a fraction of ``s = min(H, W)`` and rounds to at least one pixel.
    """

    brush: float = 1 / 96
    """Brush radius of scribbles and of the Gaussian point stamp."""
    point_shrink: tuple[float, float] = (0.3, 0.6)
    """Range of the ratio by which the maximal inscribed rectangle is shrunk before its side
    midpoints become points."""
    point_bg_margin: float = 0.25
    """Background points sit this fraction of the object's size outside its bounding box."""
    scribble_band: tuple[float, float] = (0.35, 0.65)
    """Relative depth band (distance to the boundary / the component's maximum) that is
    eroded out of each object and skeletonised into a scribble."""
    scribble_bg_ring: tuple[float, float] = (0.25, 0.45)
    """Distance band (in units of the foreground's equivalent radius) outside the objects whose
    skeleton is the background scribble."""
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
        for name in ("point_shrink", "scribble_band", "scribble_bg_ring"):
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi:
                raise ValueError(f"WeakLabelParams.{name} must satisfy 0 <= lo < hi, got {lo, hi}")
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
