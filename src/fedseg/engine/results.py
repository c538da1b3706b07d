"""``results.json`` of a run, evaluation-reply checks and communication totals.

The engine writes these numbers; tables and figures are rendered from them by the caller
(``fedseg.reporting``), so the engine never imports the reporting package.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fedseg.config import RunConfig
from fedseg.engine.worker import EvalReply
from fedseg.errors import UploadError
from fedseg.metrics import EMPTY_POLICY, METRICS, mean_over_sites

__all__ = ["BOUNDED", "build_results", "communication_summary", "validate_evaluation"]

BOUNDED = ("dsc", "jaccard", "precision", "recall")
"""Metrics whose values lie in [0, 1]; the distances (HD95, ASSD) are >= 0."""


def validate_evaluation(site: str, reply: EvalReply, regions: Iterable[str] | None = None) -> None:
    """UploadError unless ``reply`` is a plausible evaluation: known metrics, the expected
    regions, finite values in range (overlaps in [0, 1], distances >= 0), cases > 0."""
    if not isinstance(reply.cases, int) or reply.cases <= 0:
        raise UploadError(f"site {site!r}: evaluation needs cases > 0, got {reply.cases!r}")
    unknown = sorted(set(reply.metrics) - set(METRICS))
    if unknown or not reply.metrics:
        raise UploadError(f"site {site!r}: evaluation has unknown or no metrics {unknown}")
    want = None if regions is None else set(regions)
    for metric, per in reply.metrics.items():
        if want is not None and set(per) != want:
            raise UploadError(
                f"site {site!r}: {metric} regions should be {sorted(want)}, got {sorted(per)}"
            )
        for region, v in per.items():
            ok = isinstance(v, int | float) and math.isfinite(v) and v >= 0
            if ok and metric in BOUNDED:
                ok = v <= 1
            if not ok:
                limits = "[0, 1]" if metric in BOUNDED else ">= 0"
                raise UploadError(
                    f"site {site!r}: {metric} of {region!r} must be finite and {limits}, got {v!r}"
                )


def communication_summary(rounds: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Mean upload/download per participating site per round and the run's totals, from
    the ``comm`` entries of ``rounds.jsonl`` records (every tensor that travelled)."""
    per: dict[str, list[float]] = {"upload": [], "download": []}
    totals = {"upload": 0.0, "download": 0.0}
    values = {"upload": [], "download": []}  # type: dict[str, list[float]]
    for rec in rounds:
        for way in ("upload", "download"):
            sizes = (rec.get("comm") or {}).get(way, {})
            for v in sizes.values():
                per[way].append(v["bytes"])
                values[way].append(v["values"])
                totals[way] += v["bytes"]
    out: dict[str, float] = {}
    for way in ("upload", "download"):
        n = max(len(per[way]), 1)
        out[f"{way}_bytes_per_site_round"] = sum(per[way]) / n
        out[f"{way}_values_per_site_round"] = sum(values[way]) / n
        out[f"{way}_bytes_total"] = totals[way]
    return out


def build_results(
    cfg: RunConfig,
    per_site: Mapping[str, EvalReply],
    *,
    params: dict[str, int],
    timing: dict[str, Any],
    communication: dict[str, float],
    engine: str,
    participation: dict[str, int],
    eval_failures: Mapping[str, str],
) -> dict[str, Any]:
    """Assemble ``results.json``: per-site metrics, their unweighted and test-count-weighted
    means, parameter counts, measured communication, timing and who took part."""
    sites = {s: v.metrics for s, v in per_site.items()}
    cases = {s: v.cases for s, v in per_site.items()}
    out = {
        "method": cfg.method_name,
        "name": cfg.name,
        "labels": cfg.data.labels,
        "seed": cfg.seed,
        "engine": engine,
        "sites": sites,
        "average": mean_over_sites(sites),
        "weighted_average": mean_over_sites(sites, weights=cases),
        "cases": cases,
        "params": params,
        "communication": communication,
        "timing": timing,
        "participation": participation,
        "empty_policy": EMPTY_POLICY,
    }
    if eval_failures:
        out["missing_sites"] = dict(eval_failures)
    return out
