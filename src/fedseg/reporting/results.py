"""``results.json`` and the per-site Markdown table of a run."""

from __future__ import annotations

import math
from typing import Any

from fedseg.config import RunConfig
from fedseg.metrics import mean_over_sites

__all__ = ["METRIC_LABELS", "build_results", "fmt", "site_table"]

METRIC_LABELS = {
    "dsc": "DSC",
    "hd95": "HD95",
    "assd": "ASSD",
    "jaccard": "Jaccard",
    "precision": "Precision",
    "recall": "Recall",
}


def build_results(
    cfg: RunConfig,
    per_site: dict[str, dict[str, Any]],
    *,
    params: dict[str, int],
    timing: dict[str, Any],
    empty_policy: Any,
) -> dict[str, Any]:
    """Assemble ``results.json``: per-site metrics, their unweighted and test-count-weighted
    means, communication sizes and timing."""
    sites = {s: v["metrics"] for s, v in per_site.items()}
    cases = {s: v["cases"] for s, v in per_site.items()}
    return {
        "method": cfg.method_name,
        "name": cfg.name,
        "labels": cfg.data.labels,
        "seed": cfg.seed,
        "sites": sites,
        "average": mean_over_sites(sites),
        "weighted_average": mean_over_sites(sites, weights=cases),
        "cases": cases,
        "params": params,
        "timing": timing,
        "empty_policy": empty_policy,
    }


def fmt(value: float, metric: str) -> str:
    """Percent for overlap metrics, two decimals for distances."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}" if metric not in ("hd95", "assd") else f"{value:.2f}"


def site_table(results: dict[str, Any], metrics: tuple[str, ...] | None = None) -> str:
    """Markdown table: sites (and averages) as rows, metric x region as columns."""
    sites = results["sites"]
    first = next(iter(sites.values()))
    metrics = metrics or tuple(m for m in METRIC_LABELS if m in first)
    regions = list(first[metrics[0]])
    head = ["Site", "n"] + [f"{METRIC_LABELS[m]} {r}" for m in metrics for r in regions]
    rows = [
        [s, str(results["cases"][s])] + [fmt(v[m][r], m) for m in metrics for r in regions]
        for s, v in sites.items()
    ]
    for label, key in (("Average", "average"), ("Weighted avg", "weighted_average")):
        avg = results[key]
        rows.append([f"**{label}**", ""] + [fmt(avg[m][r], m) for m in metrics for r in regions])
    lines = [
        f"# {results['method']} ({results['labels']} labels): {results['name']}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "DSC, Jaccard, precision, recall in %; HD95 and ASSD in pixels (or mm with spacing).",
        f"Parameters: total {results['params']['total']:,}, upload {results['params']['upload']:,},"
        f" download {results['params']['download']:,} per client per round.",
    ]
    return "\n".join(lines) + "\n"
