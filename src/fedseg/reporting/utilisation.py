"""Virtual-row utilisation of a fedvc run per class and round (``vc_*`` site metrics)."""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["utilisation_html", "utilisation_markdown", "utilisation_rows"]

_KEY = re.compile(r"vc_(rows|entropy|shared)_c(\d+)$")
HEAD = ("round", "class", "rows used", "entropy (bits)", "share on other classes' rows")


def utilisation_rows(rounds: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Per logged class at the first, middle and last round with ``vc_*`` metrics: rows used,
    entropy and shared share, each the mean over the sites that report it; [] without any."""
    logged = [
        r for r in rounds if any(_KEY.match(k) for c in r.get("clients", {}).values() for k in c)
    ]
    if not logged:
        return []
    picks = sorted({0, len(logged) // 2, len(logged) - 1})
    out = []
    for i in picks:
        rec = logged[i]
        per: dict[tuple[str, str], list[float]] = {}
        for metrics in rec["clients"].values():
            for key, value in metrics.items():
                if m := _KEY.match(key):
                    per.setdefault((m.group(2), m.group(1)), []).append(float(value))
        for c in sorted({c for c, _ in per}, key=int):
            cells = [
                statistics.fmean(per.get((c, k), [float("nan")]))
                for k in ("rows", "entropy", "shared")
            ]
            out.append((str(rec["round"] + 1), c, *(f"{v:.2f}" for v in cells)))
    return out


def utilisation_markdown(rounds: Sequence[dict[str, Any]]) -> list[str]:
    """The utilisation as Markdown lines ([] for runs without virtual classes)."""
    rows = utilisation_rows(rounds)
    if not rows:
        return []
    lines = [
        "Virtual-row utilisation (mean over sites):",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
    ]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def utilisation_html(rounds: Sequence[dict[str, Any]]) -> str:
    """The utilisation as an HTML table ('' for runs without virtual classes)."""
    rows = utilisation_rows(rounds)
    if not rows:
        return ""
    th = "".join(f"<th>{h}</th>" for h in HEAD)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<p>Virtual-row utilisation (mean over sites):</p><table><tr>{th}</tr>{body}</table>"
