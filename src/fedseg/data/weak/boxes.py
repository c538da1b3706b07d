"""Box and rotated-box annotations and their conversion to scribbles or blocks (paper Sec. III-D).

A box annotation carries no pixel labels, so the conversion uses only the boxes, never the
mask: ``box_to_block`` labels a shrunk inscribed ellipse of each box as its class and
everything beyond a margin around all boxes as background; ``box_to_scribble`` draws an
ellipse ring inside each box (between a box and the box nested in it, e.g. the optic-disc rim
around the cup) and the outline of each box grown by a margin as background.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from fedseg.data.manifest import IGNORE_INDEX
from fedseg.data.weak.params import WeakLabelParams
from fedseg.data.weak.sparse import block_label, meaningful_regions, scribble_label

__all__ = ["Box", "box_label", "box_to_block", "box_to_scribble", "boxes_of"]


@dataclass(frozen=True)
class Box:
    """A (possibly rotated) rectangle around one object of class ``cls``, in OpenCV's
    RotatedRect convention: centre (x, y), size (width, height) and angle in degrees."""

    cls: int
    center: tuple[float, float]
    size: tuple[float, float]
    angle: float = 0.0

    @property
    def area(self) -> float:
        return self.size[0] * self.size[1]

    def scaled(self, factor: float, margin: float = 0.0) -> tuple:
        """The RotatedRect of this box with sides scaled by ``factor`` plus ``2 * margin``."""
        w, h = self.size
        return self.center, (w * factor + 2 * margin, h * factor + 2 * margin), self.angle

    def contains(self, other: Box) -> bool:
        """Whether ``other``'s centre lies inside this box."""
        corners = cv2.boxPoints(self.scaled(1.0)).astype(np.float32)
        return cv2.pointPolygonTest(corners, other.center, False) >= 0


def boxes_of(mask: np.ndarray, *, rotated: bool, min_pixels: int = 1) -> list[Box]:
    """One box per meaningful connected region of each foreground class
    (:func:`~fedseg.data.weak.sparse.meaningful_regions` with ``min_pixels``): the bounding
    rectangle, or with ``rotated`` the minimum-area enclosing rectangle (``cv2.minAreaRect``)."""
    boxes = []
    for c in (int(v) for v in np.unique(mask) if v > 0):
        for region in meaningful_regions(mask, c, min_pixels):
            ys, xs = np.nonzero(region)
            if rotated:
                points = np.column_stack([xs, ys]).astype(np.float32)
                (cx, cy), (w, h), angle = cv2.minAreaRect(points)
                boxes.append(Box(c, (cx, cy), (w + 1, h + 1), angle))
            else:
                w, h = xs.max() - xs.min() + 1, ys.max() - ys.min() + 1
                center = ((xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2)
                boxes.append(Box(c, center, (float(w), float(h))))
    return sorted(boxes, key=lambda b: -b.area)


def box_to_block(shape: tuple[int, int], boxes: list[Box], p: WeakLabelParams) -> np.ndarray:
    """Block-like label from boxes: shrunk inscribed ellipses as foreground, far background."""
    out = np.full(shape, IGNORE_INDEX, np.uint8)
    near = np.zeros(shape, np.uint8)
    for box in boxes:
        margin = p.box_bg_margin * max(box.size)
        cv2.fillPoly(near, [_corners(box.scaled(1.0, margin))], 1)
    out[near == 0] = 0
    for box in boxes:  # largest first, so nested boxes carve their own labels
        cv2.ellipse(out, box.scaled(p.box_ignore_grow), IGNORE_INDEX, -1)
        cv2.ellipse(out, box.scaled(p.box_fg_shrink), box.cls, -1)
    return out


def box_to_scribble(shape: tuple[int, int], boxes: list[Box], p: WeakLabelParams) -> np.ndarray:
    """Scribble-like label from boxes: an ellipse ring per box and, as background, the outline of
    every outermost box grown by a margin (clipped to lie outside all boxes)."""
    out = np.full(shape, IGNORE_INDEX, np.uint8)
    thickness = 2 * p.pixels(p.brush, shape) + 1
    inside = np.zeros(shape, np.uint8)
    for i, box in enumerate(boxes):
        cv2.fillPoly(inside, [_corners(box.scaled(1.0))], 1)
        if not any(outer.contains(box) for outer in boxes[:i]):
            margin = p.box_bg_margin * max(box.size) + thickness
            cv2.polylines(out, [_corners(box.scaled(1.0, margin))], True, 0, thickness)
    out[(inside == 1) & (out == 0)] = IGNORE_INDEX
    for i, box in enumerate(boxes):
        nested = [b for b in boxes[i + 1 :] if b.cls != box.cls and box.contains(b)]
        if nested:
            inner = nested[0]
            size = ((box.size[0] + inner.size[0]) / 2, (box.size[1] + inner.size[1]) / 2)
            ring = (box.center, size, box.angle)
        else:
            ring = box.scaled(p.box_ring)
        cv2.ellipse(out, ring, box.cls, thickness)
    return out


def box_label(
    mask: np.ndarray,
    rng: np.random.Generator,
    p: WeakLabelParams,
    *,
    rotated: bool,
    conversion: str,
) -> np.ndarray:
    """Boxes of ``mask`` converted to a ``scribble`` or ``block`` label.

    A mask without foreground has no box: the image is then labeled like a background-only
    scribble or block annotation.
    """
    boxes = boxes_of(mask, rotated=rotated, min_pixels=p.min_region_pixels(mask.shape))
    from_boxes, without_boxes = {
        "scribble": (box_to_scribble, scribble_label),
        "block": (box_to_block, block_label),
    }[conversion]
    return from_boxes(mask.shape, boxes, p) if boxes else without_boxes(mask, rng, p)


def _corners(rect: tuple) -> np.ndarray:
    return np.round(cv2.boxPoints(rect)).astype(np.int32)
