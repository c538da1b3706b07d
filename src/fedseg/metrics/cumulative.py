"""Accumulate per-case metrics over batches, average over cases, then over sites."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import TypedDict, cast

import numpy as np

from fedseg.metrics._inputs import (
    METRICS,
    LabelMap,
    MetricError,
    Spacing,
    as_label_map,
    check_metric_names,
    check_regions,
)
from fedseg.metrics.functional import score_regions

__all__ = ["CaseRecord", "MetricAccumulator", "mean_over_sites"]


class CaseRecord(TypedDict):
    """One scored case, kept for per-case reports (JSON-serialisable)."""

    index: int
    """Position among the cases added since the last reset."""
    id: str | None
    """Caller-given case id, if any."""
    metrics: dict[str, dict[str, float]]
    """``{metric: {region: value}}``."""
    empty_target: list[str]
    """Regions whose target is empty in this case."""
    empty_prediction: list[str]
    """Regions whose prediction is empty in this case."""


def _batch(x: LabelMap, name: str) -> np.ndarray:
    """A batch ``[B, *S]`` of 2D/3D label maps; a singleton channel axis 1 is dropped."""
    arr = as_label_map(x, name)
    if arr.ndim in (4, 5) and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim not in (3, 4):
        raise MetricError(
            f"{name} must be [B, *S] or [B, 1, *S] with 2D or 3D S, got shape {arr.shape}"
        )
    return arr


def _per_case_spacing(spacing: Spacing | Sequence[Spacing], n: int) -> list[Spacing]:
    """Split ``spacing`` into one entry per case; a flat sequence of numbers is shared."""
    if not isinstance(spacing, (Sequence, np.ndarray)):
        return [spacing] * n
    items = list(spacing)
    if all(isinstance(v, Real) for v in items):
        return [cast("Sequence[float]", spacing)] * n
    if len(items) != n:
        raise MetricError(
            f"spacing must be one spacing for the batch or one per case ({n}), "
            f"got {len(items)} entries"
        )
    return items


class MetricAccumulator:
    """Collect region metrics case by case and average them with equal weight per case.

    Parameters
    ----------
    regions
        Region name -> class indices whose union forms it (see :func:`region_metrics`).
    metrics
        Subset of :data:`METRICS` to compute.

    Examples
    --------
    >>> import numpy as np
    >>> acc = MetricAccumulator({"cup": [2], "disc": [1, 2]}, metrics=["dsc"])
    >>> target = np.zeros((1, 8, 8), dtype=int)
    >>> target[0, 2:6, 2:6] = 1
    >>> target[0, 3:5, 3:5] = 2
    >>> acc.add(target, target, ids=["eye01"])
    >>> acc.aggregate()
    {'dsc': {'cup': 1.0, 'disc': 1.0}}
    """

    def __init__(
        self, regions: Mapping[str, Sequence[int]], metrics: Sequence[str] = METRICS
    ) -> None:
        self.regions = check_regions(regions)
        self.metrics = check_metric_names(metrics)
        self._records: list[CaseRecord] = []

    def __len__(self) -> int:
        return len(self._records)

    def add(
        self,
        pred_batch: LabelMap,
        target_batch: LabelMap,
        spacing: Spacing | Sequence[Spacing] = None,
        ids: Sequence[str] | None = None,
    ) -> None:
        """Score a batch of cases; nothing is recorded if any case is invalid.

        Parameters
        ----------
        pred_batch, target_batch
            Integer label maps ``[B, *S]`` or ``[B, 1, *S]``, ``S`` 2D or 3D.
        spacing
            ``None`` (pixels), one spacing for every case (a number or one number per
            axis), or a list with one spacing (or ``None``) per case.
        ids
            Optional case ids, one per case.

        Raises
        ------
        MetricError
            On mismatched shapes, lengths, dtypes or spacing.
        """
        p, t = _batch(pred_batch, "pred_batch"), _batch(target_batch, "target_batch")
        if p.shape != t.shape:
            raise MetricError(
                f"pred_batch and target_batch must have the same shape, got {p.shape} and {t.shape}"
            )
        n = len(p)
        spacings = _per_case_spacing(spacing, n)
        if ids is not None and len(ids) != n:
            raise MetricError(f"ids must give one id per case ({n}), got {len(ids)}")
        new: list[CaseRecord] = []
        for i in range(n):
            s = score_regions(p[i], t[i], self.regions, spacings[i], self.metrics)
            new.append(
                CaseRecord(
                    index=len(self._records) + i,
                    id=None if ids is None else str(ids[i]),
                    metrics=s.values,
                    empty_target=list(s.empty_target),
                    empty_prediction=list(s.empty_prediction),
                )
            )
        self._records.extend(new)

    def aggregate(self) -> dict[str, dict[str, float]]:
        """Mean of every metric over all cases added, ``{metric: {region: mean}}``.

        Raises
        ------
        MetricError
            If no case has been added.
        """
        n = len(self._records)
        if n == 0:
            raise MetricError("no cases to aggregate: add() was never called since reset()")
        return {
            m: {r: math.fsum(c["metrics"][m][r] for c in self._records) / n for r in self.regions}
            for m in self.metrics
        }

    @property
    def per_case(self) -> list[CaseRecord]:
        """The records of every case added since the last reset, in order."""
        return list(self._records)

    @property
    def empty_target_counts(self) -> dict[str, int]:
        """Number of cases whose target region is empty, per region."""
        return {r: sum(r in c["empty_target"] for c in self._records) for r in self.regions}

    def reset(self) -> None:
        """Forget every case."""
        self._records.clear()


def mean_over_sites(
    results: Mapping[str, Mapping[str, Mapping[str, float]]],
    weights: Mapping[str, float] | None = None,
) -> dict[str, dict[str, float]]:
    """Average per-site results ``{site: {metric: {region: value}}}`` over sites.

    Parameters
    ----------
    results
        Each site's aggregated metrics; every site must report the same metrics and
        regions.
    weights
        Site -> non-negative weight (e.g. its number of test cases); ``None`` weighs
        sites equally. NaN values are not dropped: they make the mean NaN.

    Returns
    -------
    dict
        ``{metric: {region: weighted mean}}``, the same shape as one site's results.

    Raises
    ------
    MetricError
        If there is no site, sites disagree on metrics/regions, or weights are invalid.
    """
    if not results:
        raise MetricError("results must hold at least one site, got none")
    first_site, first = next(iter(results.items()))
    layout = {m: sorted(regions) for m, regions in first.items()}
    for site, res in results.items():
        got = {m: sorted(regions) for m, regions in res.items()}
        if got != layout:
            raise MetricError(
                f"site {site!r} reports {got} but site {first_site!r} reports {layout}"
            )
    w = dict.fromkeys(results, 1.0) if weights is None else _check_weights(weights, results)
    total = math.fsum(w.values())
    return {
        m: {r: math.fsum(w[s] * results[s][m][r] for s in results) / total for r in regions}
        for m, regions in first.items()
    }


def mean_over_regions(
    result: Mapping[str, Mapping[str, float]], regions: Sequence[str] | None = None
) -> dict[str, float]:
    """Average one result ``{metric: {region: value}}`` over regions: ``{metric: mean}``.

    The virtual-class paper's mIoU is this mean of ``jaccard`` over the foreground regions
    (fundus: disc and cup; polyp: the polyp), and its HD that of ``hd``. ``regions`` selects
    regions (default: all); every metric must report them. NaN values propagate.

    Raises
    ------
    MetricError
        If there is no region or a metric lacks a selected region.
    """
    if not result:
        raise MetricError("result must hold at least one metric, got none")
    chosen = list(regions) if regions is not None else list(next(iter(result.values())))
    if not chosen:
        raise MetricError("regions must name at least one region, got none")
    out = {}
    for m, values in result.items():
        missing = [r for r in chosen if r not in values]
        if missing:
            raise MetricError(f"metric {m!r} has no regions {missing}; it has {list(values)}")
        out[m] = math.fsum(values[r] for r in chosen) / len(chosen)
    return out


def _check_weights(weights: Mapping[str, float], sites: Mapping[str, object]) -> dict[str, float]:
    missing, extra = sorted(set(sites) - set(weights)), sorted(set(weights) - set(sites))
    if missing or extra:
        raise MetricError(
            f"weights must give one weight per site: missing {missing}, unknown {extra}"
        )
    bad = {s: v for s, v in weights.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        raise MetricError(f"weights must be finite and >= 0, got {bad}")
    if math.fsum(weights.values()) <= 0:
        raise MetricError(f"weights must not all be zero, got {dict(weights)}")
    return {s: float(weights[s]) for s in sites}
