"""FedLPPA's personalisation read from finished runs: prompt affinity, its drift, LA weights.

    python benchmarks/fedlppa_prompts.py docs/evidence/fedlppa-table3/runs/fedlppa/seed* \
        --out docs/evidence/fedlppa-table3/personalisation

Reads each run's ``rounds.jsonl`` (FedLPPA logs the N x N prompt ``affinity`` of Eqs. 7-8, its
``affinity_drift`` since round 1 and ``affinity_change`` since the previous round, and per
site the LA weight statistics ``la_main_mean``, ``la_aux_mean``, ``la_main_local_share``) and
the federation's manifest (each site's annotation type). Writes ``prompts.md`` (per run: the
last affinity matrix, drift at quarters of the run, whether the site pairs keep the order of
the first logged round (Spearman) and where the same-family pairs rank, mean affinity of site
pairs with the same annotation family against pairs with different ones: the paper's premise
that sites labelled alike end up closer, LA weights at the last round) and ``prompts.png``
(drift per round, LA main-decoder weight per round and site, the last affinity matrix of the
first run). It reads files only; nothing is trained.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from itertools import combinations
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr

from fedseg.reporting.runs import site_facts


def family(annotation: str) -> str:
    """An annotation type without its variant number (``scribble2`` -> ``scribble``)."""
    return re.sub(r"\d+$", "", annotation)


def read_run(run_dir: Path) -> dict[str, Any]:
    """Per-round drift, LA weights, the last affinity matrix and the sites' annotations."""
    records = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines() if x]
    drift = [
        (r["round"] + 1, r["server"]["affinity_drift"])
        for r in records
        if "affinity_drift" in r.get("server", {})
    ]
    with_matrix = [r for r in records if "affinity" in r.get("server", {})]
    if not with_matrix:
        raise SystemExit(f"{run_dir}: no affinity in rounds.jsonl (FedLPPA with tdf: true?)")
    first, last = with_matrix[0], with_matrix[-1]["server"]
    names = last.get("affinity_sites") or sorted(records[-1]["clients"])
    la = {
        s: [
            (r["round"] + 1, r["clients"][s]["la_main_mean"])
            for r in records
            if "la_main_mean" in r.get("clients", {}).get(s, {})
        ]
        for s in names
    }
    facts = site_facts(run_dir)
    annotations = {s: facts[s].annotation if s in facts else "?" for s in names}
    return {
        "dir": run_dir,
        "names": names,
        "matrix": last["affinity"],
        "first": first["server"]["affinity"],
        "rounds": (first["round"] + 1, with_matrix[-1]["round"] + 1),
        "drift": drift,
        "la": la,
        "annotations": annotations,
        "la_last": {s: records[-1]["clients"].get(s, {}) for s in names},
    }


def rank_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman correlation of the off-diagonal entries of two affinity matrices: 1 when
    the site pairs are ordered as in ``a``."""
    mask = ~torch.eye(len(a), dtype=torch.bool)
    return float(spearmanr(a[mask].numpy(), b[mask].numpy()).statistic)


def family_pair_ranks(
    names: list[str], annotations: dict[str, str], before: torch.Tensor, after: torch.Tensor
) -> list[str]:
    """Each pair of sites with the same annotation family: its affinity rank among all site
    pairs (1 = closest) in ``before`` and in ``after``."""
    pairs = list(combinations(range(len(names)), 2))

    def rank(m: torch.Tensor, pair: tuple[int, int]) -> int:
        order = sorted(pairs, key=lambda p: -float(m[p]))
        return order.index(pair) + 1

    return [
        f"{names[i]}-{names[j]} {rank(before, (i, j))} -> {rank(after, (i, j))} of {len(pairs)}"
        for i, j in pairs
        if family(annotations[names[i]]) == family(annotations[names[j]])
    ]


def premise(run: dict[str, Any]) -> tuple[float | None, int, float | None, int]:
    """Mean off-diagonal affinity of same-family pairs and of different-family pairs."""
    same, other = [], []
    for i, j in combinations(range(len(run["names"])), 2):
        a, b = (family(run["annotations"][run["names"][k]]) for k in (i, j))
        value = (run["matrix"][i][j] + run["matrix"][j][i]) / 2
        (same if a == b else other).append(value)
    return _mean(same), len(same), _mean(other), len(other)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def quarters(curve: list[tuple[int, float]]) -> str:
    if not curve:
        return "n/a"
    n = len(curve)
    picks = sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
    return ", ".join(f"r{curve[k][0]} {curve[k][1]:.3f}" for k in picks)


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = ["# FedLPPA personalisation", ""]
    for run in runs:
        names = run["names"]
        same, n_same, other, n_other = premise(run)
        before, after = torch.tensor(run["first"]), torch.tensor(run["matrix"])
        r0, r1 = run["rounds"]
        lines += [
            f"## {run['dir']}",
            "",
            "Sites: " + ", ".join(f"{s} ({run['annotations'][s]})" for s in names),
            "",
            "| | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        lines += [
            f"| {s} | " + " | ".join(f"{v:.3f}" for v in row) + " |"
            for s, row in zip(names, run["matrix"], strict=True)
        ]
        lines += [
            "",
            f"- affinity drift since round 1: {quarters(run['drift'])}",
            f"- order of the site pairs, round {r0} vs {r1} (Spearman): "
            f"{rank_agreement(before, after):.2f}; same-family pairs' affinity rank "
            f"(1 = closest), round {r0} -> {r1}: "
            + (", ".join(family_pair_ranks(names, run["annotations"], before, after)) or "none"),
            f"- mean affinity, same annotation family: {_fmt(same)} ({n_same} pairs); "
            f"different families: {_fmt(other)} ({n_other} pairs)",
            "- LA at the last round (main decoder: mean weight, local share; aux: mean): "
            + "; ".join(
                f"{s} {v.get('la_main_mean', float('nan')):.3f} / "
                f"{v.get('la_main_local_share', float('nan')):.3f} / "
                f"{v.get('la_aux_mean', float('nan')):.3f}"
                for s, v in run["la_last"].items()
            ),
            "",
        ]
    return "\n".join(lines) + "\n"


def figure(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        if run["drift"]:
            a.plot(*zip(*run["drift"], strict=True), label=run["dir"].name)
    a.set(title="prompt affinity drift since round 1", xlabel="round", ylabel="max |A_r - A_1|")
    a.legend(fontsize=7)
    for s, curve in runs[0]["la"].items():
        if curve:
            b.plot(*zip(*curve, strict=True), label=f"{s} ({runs[0]['annotations'][s]})")
    b.set(title=f"LA main-decoder mean weight ({runs[0]['dir'].name})", xlabel="round")
    b.legend(fontsize=7)
    names = runs[0]["names"]
    im = c.imshow(runs[0]["matrix"], cmap="viridis")
    labels = [f"{s}\n{runs[0]['annotations'][s]}" for s in names]
    c.set_xticks(range(len(names)), labels, fontsize=7)
    c.set_yticks(range(len(names)), labels, fontsize=7)
    c.set_title("last prompt affinity")
    fig.colorbar(im, ax=c)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FedLPPA run directories")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = [read_run(d) for d in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompts.md").write_text(markdown(runs))
    figure(runs, args.out / "prompts.png")
    print((args.out / "prompts.md").read_text())


if __name__ == "__main__":
    main()
