"""The volume importers' shared case loop: cutting a case into samples and writing them.

:func:`case_samples` fits one case (a 3D volume, or its 2D slices along the first axis) to the
federation's shape; :func:`write_case` writes those samples and counts the dropped slices;
:func:`each_case` walks an import plan site by site and reports progress. Used by the NIfTI,
nnU-Net/MSD and DICOM importers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np

from fedseg.data.arrays import center_crop_or_pad, resize_image, resize_mask
from fedseg.data.writer import FederationWriter

__all__ = ["case_samples", "each_case", "write_case"]

T = TypeVar("T")


def each_case(
    plan: Mapping[str, Sequence[T]], progress: Callable[[int, int], None] | None
) -> Iterator[tuple[str, T]]:
    """``(site, case)`` for every case of ``plan`` (site -> cases), in order; after each case
    is handled, ``progress(done, total)`` when given."""
    total, done = sum(len(v) for v in plan.values()), 0
    for site, cases in plan.items():
        for case in cases:
            yield site, case
            done += 1
            if progress is not None:
                progress(done, total)


def write_case(
    writer: FederationWriter,
    site: str,
    split: str,
    case: str,
    image: np.ndarray,
    label: np.ndarray,
    spacing: Sequence[float],
    *,
    shape: Sequence[int],
    fit: str,
    drop_empty: bool,
    origin: str,
) -> int:
    """Write the samples (:func:`case_samples`) of one case, image (C, D, H, W) and label
    (D, H, W), to ``writer``; returns how many of its 2D slices were dropped as empty (0 in
    3D)."""
    samples = case_samples(case, image, label, spacing, shape, fit, drop_empty)
    for sample_id, img, lab, sp in samples:
        writer.add(site, split, sample_id, img, lab, spacing=sp, origin=origin)
    return label.shape[0] - len(samples) if len(shape) == 2 else 0


def case_samples(
    case: str,
    image: np.ndarray,
    label: np.ndarray,
    spacing: Sequence[float],
    shape: Sequence[int],
    fit: str,
    drop_empty: bool,
) -> list[tuple[str, np.ndarray, np.ndarray, tuple[float, ...]]]:
    """Samples ``(id, image, label, spacing)`` of one case: image (C, D, H, W), label (D, H, W).

    A 3D ``shape`` keeps the volume, fitted by resizing or centre cropping/padding (``fit``); a
    2D ``shape`` cuts slices along D (ids ``<case>_<k>``, fitted alike; empty-mask slices
    dropped when ``drop_empty``).
    """
    if len(shape) == 3:
        return [(case, *_fit(image, label, spacing, shape, fit))]
    return [
        (f"{case}_{k:03d}", *_fit(image[:, k], label[k], spacing[1:], shape, fit))
        for k in range(label.shape[0])
        if label[k].any() or not drop_empty
    ]


def _fit(
    image: np.ndarray, label: np.ndarray, spacing: Sequence[float], shape: Sequence[int], fit: str
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Channel-first ``image`` and ``label`` fitted to ``shape``; spacing follows resizing."""
    if fit == "crop":
        return center_crop_or_pad(image, shape), center_crop_or_pad(label, shape), tuple(spacing)
    scaled = tuple(s * n / m for s, n, m in zip(spacing, label.shape, shape, strict=True))
    return resize_image(image, shape), resize_mask(label, shape), scaled
