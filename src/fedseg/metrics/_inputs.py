"""Validation and conversion of metric inputs: label maps, spacing, regions, metric names."""

from __future__ import annotations

import difflib
import math
from collections.abc import Hashable, Mapping, Sequence
from numbers import Integral, Real
from typing import TypeAlias, TypeVar

import numpy as np
import torch

from fedseg.errors import FedsegError

__all__ = [
    "METRICS",
    "LabelMap",
    "MetricError",
    "Spacing",
    "as_label_map",
    "check_metric_names",
    "check_pair",
    "check_regions",
    "normalize_spacing",
]

METRICS: tuple[str, ...] = ("dsc", "hd95", "assd", "jaccard", "precision", "recall", "hd")
"""Every metric fedseg computes, in report order."""

LabelMap: TypeAlias = "np.ndarray | torch.Tensor"
"""An integer (or boolean) label map: a numpy array or a torch tensor."""

Spacing: TypeAlias = "float | Sequence[float] | None"
"""Physical size of a pixel/voxel: one value per axis, one value for all axes, or pixels."""

K = TypeVar("K", bound=Hashable)


class MetricError(FedsegError, ValueError):
    """A metric got malformed input (shape, dtype, labels, spacing, names) or no cases."""


def as_label_map(x: LabelMap, name: str) -> np.ndarray:
    """``x`` as a numpy array of integer or boolean labels; floats are rejected."""
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.dtype != np.bool_ and not np.issubdtype(arr.dtype, np.integer):
        raise MetricError(
            f"{name} must hold integer labels, got dtype {arr.dtype}; "
            "take the arg-max over classes or cast with .long() / .astype(int)"
        )
    return arr


def check_pair(pred: LabelMap, target: LabelMap) -> tuple[np.ndarray, np.ndarray]:
    """Convert one case's label maps and check they are 2D or 3D with equal shapes."""
    p, t = as_label_map(pred, "pred"), as_label_map(target, "target")
    if p.shape != t.shape:
        raise MetricError(f"pred and target must have the same shape, got {p.shape} and {t.shape}")
    if p.ndim not in (2, 3):
        raise MetricError(f"label maps must be 2D or 3D, got shape {p.shape}")
    return p, t


def normalize_spacing(spacing: Spacing, ndim: int) -> tuple[float, ...] | None:
    """One positive finite spacing per axis, or ``None`` for pixel units."""
    if spacing is None:
        return None
    values = tuple(spacing) if isinstance(spacing, (Sequence, np.ndarray)) else (spacing,) * ndim
    if len(values) != ndim:
        raise MetricError(
            f"spacing must give one value per axis ({ndim}), got {len(values)}: {spacing!r}"
        )
    if not all(isinstance(v, Real) and math.isfinite(v) and v > 0 for v in values):
        raise MetricError(f"spacing values must be positive finite numbers, got {spacing!r}")
    return tuple(float(v) for v in values)


def check_regions(regions: Mapping[K, Sequence[int]]) -> dict[K, tuple[int, ...]]:
    """Regions as tuples of non-negative class indices; none may be empty."""
    if not regions:
        raise MetricError("regions must name at least one region, got none")
    out: dict[K, tuple[int, ...]] = {}
    for name, classes in regions.items():
        if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence):
            raise MetricError(
                f"region {name!r} must be a sequence of class indices, got {classes!r}"
            )
        if not classes or not all(isinstance(c, Integral) and c >= 0 for c in classes):
            raise MetricError(
                f"region {name!r} must list one or more class indices >= 0, got {classes!r}"
            )
        out[name] = tuple(int(c) for c in classes)
    return out


def check_metric_names(metrics: Sequence[str]) -> tuple[str, ...]:
    """Known metric names without duplicates, in the given order."""
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not metrics:
        raise MetricError(f"metrics must name at least one of {list(METRICS)}, got none")
    for m in metrics:
        if m not in METRICS:
            close = difflib.get_close_matches(str(m), METRICS, n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise MetricError(f"unknown metric {m!r}: choose from {list(METRICS)}{hint}")
    return tuple(dict.fromkeys(metrics))
