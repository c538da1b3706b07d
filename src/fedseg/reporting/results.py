"""The per-site Markdown table of a run (``results.md``) from its ``results.json``."""

from __future__ import annotations

from typing import Any

from fedseg.run_table import fmt

__all__ = ["METRIC_LABELS", "fmt", "privacy_note", "site_table"]

METRIC_LABELS = {
    "dsc": "DSC",
    "hd95": "HD95",
    "hd": "HD",
    "assd": "ASSD",
    "jaccard": "Jaccard",
    "precision": "Precision",
    "recall": "Recall",
}


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
        *_missing_note(results),
        "DSC, Jaccard, precision, recall in %; HD95 and ASSD in pixels (or mm with spacing).",
        f"Parameters: total {results['params']['total']:,}, upload {results['params']['upload']:,},"
        f" download {results['params']['download']:,} per client per round.",
        *privacy_note(results.get("privacy")),
    ]
    return "\n".join(lines) + "\n"


def privacy_note(dp: dict[str, Any] | None) -> list[str]:
    """The differential-privacy line of a DP run (local mode: epsilon is the largest site's)."""
    if not dp:
        return []
    most = " (largest over sites)" if dp["mode"] == "local" else ""
    return [
        f"Differential privacy ({dp['mode']}): clip {dp['clip']:g}, noise multiplier "
        f"{dp['noise_multiplier']:g}, ε = {dp['epsilon']:.3g}{most} at δ = {dp['delta']:g} "
        f"after {dp['rounds']} rounds."
    ]


def _missing_note(results: dict[str, Any]) -> list[str]:
    """A warning line (and a blank line) when sites failed to evaluate: the averages then
    cover only the sites in the table; [] when every site reported."""
    missing = results.get("missing_sites") or {}
    if not missing:
        return []
    listed = "; ".join(f"{site} ({' '.join(str(why).split())})" for site, why in missing.items())
    n, total = len(results["sites"]), len(results["sites"]) + len(missing)
    return [
        f"**Missing sites: {len(missing)} of {total} did not report an evaluation: {listed}. "
        f"The averages are over the {n} site{'s' * (n != 1)} above only.**",
        "",
    ]
