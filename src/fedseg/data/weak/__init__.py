"""Weak-label synthesis from full masks: points, scribbles, blocks, boxes (docs/weak_labels.md)."""

from fedseg.data.weak.boxes import Box, box_label, boxes_of
from fedseg.data.weak.generate import generate_weak_labels, sample_rng, weak_label
from fedseg.data.weak.params import WeakLabelParams
from fedseg.data.weak.sparse import (
    block_label,
    max_inscribed_rect,
    meaningful_regions,
    point_label,
    scribble2_label,
    scribble_label,
)

__all__ = [
    "Box",
    "WeakLabelParams",
    "block_label",
    "box_label",
    "boxes_of",
    "generate_weak_labels",
    "max_inscribed_rect",
    "meaningful_regions",
    "point_label",
    "sample_rng",
    "scribble2_label",
    "scribble_label",
    "weak_label",
]
