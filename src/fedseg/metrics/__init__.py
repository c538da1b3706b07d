"""Segmentation metrics: per-case region scores, a stated empty-case policy, averaging.

``region_metrics``/``case_metrics`` score one case; :class:`MetricAccumulator` collects
cases and averages them per site; :func:`mean_over_sites` averages sites. Definitions,
units and the empty-case policy are in ``docs/metrics.md`` and in :data:`EMPTY_POLICY`
and :data:`DEFINITIONS`, which reports record next to the numbers.
"""

from fedseg.metrics._inputs import METRICS, MetricError
from fedseg.metrics.cumulative import (
    CaseRecord,
    MetricAccumulator,
    mean_over_regions,
    mean_over_sites,
)
from fedseg.metrics.functional import (
    DEFINITIONS,
    EMPTY_POLICY,
    case_metrics,
    region_metrics,
)
from fedseg.metrics.surface import surface_distances

__all__ = [
    "DEFINITIONS",
    "EMPTY_POLICY",
    "METRICS",
    "CaseRecord",
    "MetricAccumulator",
    "MetricError",
    "case_metrics",
    "mean_over_regions",
    "mean_over_sites",
    "region_metrics",
    "surface_distances",
]
