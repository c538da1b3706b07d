"""Paired statistics of a report's rows: each row against the first on the same test cases.

A row's runs are its seeds. Per test case, the metric's mean over regions and seeds
(``cases.csv``), so pairs are independent cases; Wilcoxon signed-rank, Holm over the section's
comparisons, the median difference with a bootstrap 95 % interval (``fedseg.reproduce.stats``,
the same computation as ``fedseg reproduce``; docs/reproduce.md#reading-a-verdict).
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fedseg.reporting.results import METRIC_LABELS
from fedseg.reporting.stats import (
    Comparison,
    SeedSummary,
    case_values,
    format_p,
    holm,
    paired,
    seed_mean,
    seed_summary,
)
from fedseg.reporting.strip import strip_figure

__all__ = ["PairedRows", "paired_rows"]


@dataclass
class PairedRows:
    """Per metric: each row's case values and seed summary, and each row against the first."""

    labels: list[str]
    metrics: list[str]
    cases: dict[tuple[str, str], list[float]]
    summaries: dict[tuple[str, str], SeedSummary]
    comparisons: list[Comparison]

    def markdown(self) -> list[str]:
        """The comparisons as a Markdown table (lines)."""
        ref = self.labels[0]
        out = [
            f"### Paired tests against {ref}",
            "",
            "Per test case: mean over regions and seeds; Wilcoxon signed-rank, Holm over this "
            "section; median difference (row − reference) with its bootstrap 95 % interval. "
            "Mean: over seeds of the mean over test cases, with its 95 % t-interval.",
            "",
            "| Row | Metric | Mean [95 % CI] | Pairs | Median difference [95 % CI] | p | p (Holm) "
            "| Reading |",
            "|---|---|---|---|---|---|---|---|",
        ]
        return out + ["| " + " | ".join(cells) + " |" for cells in self._rows()] + [""]

    def html(self) -> str:
        """The comparisons as an HTML table."""
        head = [
            "Row",
            "Metric",
            "Mean [95 % CI]",
            "Pairs",
            "Median difference [95 % CI]",
            "p",
            "p (Holm)",
            "Reading",
        ]
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
            for cells in self._rows()
        )
        th = "".join(f"<th>{h}</th>" for h in head)
        return (
            f"<h3>Paired tests against {html.escape(self.labels[0])}</h3>"
            f"<table><tr>{th}</tr>{rows}</table>"
        )

    def _rows(self) -> list[list[str]]:
        by_key = {(c.row, c.metric): c for c in self.comparisons}
        out = []
        for label in self.labels:
            for m in self.metrics:
                s = self.summaries[(label, m)]
                mean = f"{s.mean:.2f}" + (f" [{s.low:.2f}, {s.high:.2f}]" if s.sd else "")
                c = by_key.get((label, m))
                if c is None or c.stats is None:
                    tail = ["—"] * 4 + ["reference" if c is None else f"refused: {c.refused}"]
                else:
                    st = c.stats
                    tail = [
                        str(st.pairs),
                        f"{st.median:.2f} [{st.low:.2f}, {st.high:.2f}]",
                        format_p(st.p),
                        format_p(c.p_holm),
                        c.better(),
                    ]
                out.append([label, METRIC_LABELS.get(m, m), mean, *tail])
        return out

    def strip(self, path: Path, title: str) -> Path:
        """Each row's per-case values per metric as a strip plot."""
        panels = {
            METRIC_LABELS.get(m, m): [self.cases[(label, m)] for label in self.labels]
            for m in self.metrics
        }
        return strip_figure(self.labels, panels, title, path)


def paired_rows(
    labels: Sequence[str], case_files: Sequence[Sequence[Path]], metrics: Sequence[str]
) -> PairedRows | None:
    """Statistics of rows (``case_files``: each row's cases.csv, one per seed) against the
    first row; None when fewer than two rows or a run has no cases.csv."""
    if len(labels) < 2 or not all(
        files and all(p.is_file() for p in files) for files in case_files
    ):
        return None
    values, summaries, cases = {}, {}, {}
    for label, files in zip(labels, case_files, strict=True):
        for m in metrics:
            per_seed = [case_values(p, m) for p in files]
            values[(label, m)] = seed_mean(per_seed, f"row {label!r}")
            cases[(label, m)] = list(values[(label, m)].values())
            summaries[(label, m)] = seed_summary([statistics.fmean(v.values()) for v in per_seed])
    ref = labels[0]
    comps = [
        Comparison(label, ref, m, paired(values[(label, m)], values[(ref, m)], f"{label} - {ref}"))
        for label in labels[1:]
        for m in metrics
    ]
    adjusted = holm([c.stats.p for c in comps])
    comps = [replace(c, p_holm=p) for c, p in zip(comps, adjusted, strict=True)]
    return PairedRows(list(labels), list(metrics), cases, summaries, comps)
