"""A parity table: each method's arms paired case by case with the authors' code.

    .venv/bin/python benchmarks/parity/table.py fedlppa-table3

Reads the arms' run folders (``<arm>/seed<k>``, each with ``cases.csv`` and
``results.json``) named in :data:`TABLES`, and writes
``docs/evidence/parity/<table>/table.md``: per method and arm the mean DSC over seeds, then
each fedseg arm against the authors' arm (median paired difference, its bootstrap 95 %
interval, the margin and the verdict of :mod:`fedseg.reporting.equivalence`; the rule is
docs/evidence/parity/README.md). The authors' own pick (``best_round/``, their best round on
the test split) is shown beside, without a verdict. A verdict waits for three seeds on both
sides.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from fedseg.reporting.equivalence import arm_average, compare_arms

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
SEEDS = 3
"""Seeds per arm before a verdict is given (the rule)."""

RUNS = "parity/fedlppa-table3/runs"
PAPER_READING = "archive/fedlppa-table3-variant-paper/fedlppa-table3/runs/fedlppa"
"""FedLPPA's Table III row as fedseg read the paper (its default until 2026-12-03)."""
BCS = "parity/fedbcs-table1-nuclei/runs"
"""FedBCS with (``--arch fsr``) and without FSR (``--arch unet``) on Table 1's nuclei federation;
the ``fedseg paper`` arms are the evidence rows (FedBCS's default, ``variant: paper``), which
augmented until the rerun that follows 2026-12-04; ``fedseg authors + clamp`` trains without
augmentation, as the code does on nuclei."""
BCS_AUTHORS = "fedseg authors + clamp"
"""``variant: authors`` with ``method.clamp: true``: the code's settings and its clamped
L_contra (the variant held the clamp until 2026-12-05; it is a defect of the code since)."""
BCS_AUG = "fedseg authors + clamp, fedseg's augmentation"
"""``variant: authors`` with fedseg's flips, right-angle rotations and intensity jitter (the
arm until 2026-12-04, when the code was found to train its nuclei federation without any)."""
WD_1E4 = "archive/fedlppa-table3-wd1e-4/runs"
"""Table III's baselines at fedseg's weight decay 1e-4 (until 2026-12-03; the table's rows
train at the code's 1e-2 since)."""
OLD_WD = "fedseg, weight decay 1e-4"

FEDBCS_R85: dict[str, dict[str, str]] = {
    "FedBCS": {
        "authors": f"{BCS}/authors-fsr-r85",
        "fedseg default": "fedbcs-table1-nuclei/runs/fedbcs",
        "fedseg, the code's clamp": f"{BCS}/fedseg-clamp-fsr-r85",
    },
    "FedBCS without FSR": {
        "authors": f"{BCS}/authors-unet-r85",
        "fedseg default": "fedbcs-table2-nuclei/runs/cdpa",
    },
}
"""The nuclei tables' budget (85 rounds): the ``fedseg default`` arms are the evidence rows
(Table 1's FedBCS, Table 2's CDPA; ``variant: authors`` gives the same config since the
clamp left it), ``fedseg, the code's clamp`` the same config with ``method.clamp: true``."""

POLYP = "parity/vc-table1-polyp/runs"
FEDDP_V1 = "fedseg authors until 2026-12-05"
"""FedDP's ``variant: authors`` before the code's foreground Dice, gradient clamp and decoder
initialisation joined it (Dice on both classes, no clamp, fedseg's FPN initialisation)."""
SMP = "smp's FPN head, until 2026-12-05"
"""Arms run on ``pvtv2_fpn`` before it defaulted to FedDP's code (``decoder_init: kaiming``,
``upsample: logits``: segmentation-models-pytorch's ``FPN`` model)."""
LOGITS = "fedseg authors, logits up-sampled"
"""The variant before ``model.upsample: probabilities`` joined it (the x4 up-sampling of the
head's logits, not of its probabilities as the code's sigmoid-then-``F.interpolate``)."""
FEDDP_POLYP: dict[str, dict[str, str]] = {
    "FedDP": {
        "authors": f"{POLYP}/authors-ours_q",
        "fedseg authors": f"{POLYP}/fedseg-authors-feddp",
        FEDDP_V1: f"{POLYP}/fedseg-authors-feddp-v1",
        "fedseg paper": f"{POLYP}/fedseg-feddp",
        f"fedseg paper, {SMP}": f"{POLYP}/fedseg-feddp-smp",
        "fedseg authors, foreground Dice": f"{POLYP}/fedseg-authors-feddp-dice-fg",
        "fedseg authors + the code's clamp": f"{POLYP}/fedseg-authors-feddp-clamp",
        "fedseg authors, the code's decoder init": f"{POLYP}/fedseg-authors-feddp-torch-init",
        "authors, fresh draws": f"{POLYP}/authors-ours_q-fresh-draws",
        LOGITS: f"{POLYP}/fedseg-authors-feddp-v2",
    },
    "FedDP, stage 1": {
        "authors": f"{POLYP}/authors-ours_q-stage1",
        FEDDP_V1: f"{POLYP}/fedseg-authors-feddp-v1-stage1",
        "authors, fresh draws": f"{POLYP}/authors-ours_q-fresh-draws-stage1",
    },
    "FedAvg": {
        "authors": f"{POLYP}/authors-fedavg",
        "fedseg": f"{POLYP}/fedseg-fedavg",
        f"fedseg, {SMP}": f"{POLYP}/fedseg-fedavg-smp",
        "fedseg, smp's FPN init, the code's up-sampling": f"{POLYP}/fedseg-fedavg-prob-upsample",
    },
    **{
        name: {"authors": f"{POLYP}/authors-{fl}", "fedseg": f"{POLYP}/fedseg-{fl}"}
        for name, fl in [("FedRep", "fedrep"), ("FedBABU", "fedbabu")]
    },
}
"""PFL-Seg-Trans's FedDP (``ours_q`` then 5 epochs of ``ours_q_bd_ft``) and its ports on the
polyp federation of virtual-class Table I, PVTv2-b0 + FPN from the code's initial weights of
each seed; the ``fedseg`` arms are fedseg's defaults on the same network and budget. The
three ``fedseg authors, ...`` diagnostic arms (seed 0) each add one difference from the code
to :data:`FEDDP_V1`: ``train.loss: dice_foreground`` (its sigmoid-channel Dice),
``train.grad_clamp: 1.0``, ``model.decoder_init: torch`` (its bare smp ``FPNDecoder``); the
variant holds all three since; ``authors, fresh draws`` is the code without its replayed
draws (``pflseg.py --fresh-draws``, seed 0). ``FedDP, stage 1``: the rounds alone
(``ft_epochs: 0``; the code's side scored from the same runs' round captures,
``pflseg.py --stage1``)."""

TABLES: dict[str, dict[str, dict[str, str]]] = {
    "fedlppa-table3": {
        "FedAvg": {
            "authors": f"{RUNS}/authors-FedAvg",
            "fedseg": "fedlppa-table3/runs/fedavg",
            OLD_WD: f"{WD_1E4}/fedavg",
        },
        "FedProx": {
            "authors": f"{RUNS}/authors-FedProx",
            "fedseg": "fedlppa-table3/runs/fedprox",
            OLD_WD: f"{WD_1E4}/fedprox",
        },
        "FedBN": {
            "authors": f"{RUNS}/authors-FedBN",
            "fedseg": "fedlppa-table3/runs/fedbn",
            OLD_WD: f"{WD_1E4}/fedbn",
        },
        "FedRep": {
            "authors": f"{RUNS}/authors-FedRep",
            "fedseg": "fedlppa-table3/runs/fedrep",
            OLD_WD: f"{WD_1E4}/fedrep",
            "fedseg, the code's FedRep settings": f"{RUNS}/fedseg-port-FedRep",
            "fedseg, its 8 + 2 split only": f"{RUNS}/fedseg-split-FedRep",
            "fedseg, SGD only": f"{RUNS}/fedseg-sgd-FedRep",
        },
        "FedALA": {
            "authors": f"{RUNS}/authors-FedALA",
            "fedseg": "fedlppa-table3/runs/fedala",
            OLD_WD: f"{WD_1E4}/fedala",
        },
        "FedLPPA": {
            "authors": f"{RUNS}/authors-FedUniV2.1",
            "fedseg authors": f"{RUNS}/fedseg-authors-FedLPPA",
            "fedseg paper": PAPER_READING,
        },
    },
    "fedbcs-table1-nuclei": {
        "FedBCS": {
            "authors": f"{BCS}/authors-fsr",
            BCS_AUTHORS: f"{BCS}/fedseg-authors-fsr",
            BCS_AUG: f"{BCS}/fedseg-authors-aug-fsr",
            "fedseg paper": "archive/fedbcs-nuclei-augmented-r104/fedbcs-table1-nuclei/runs/fedbcs",
        },
        "FedBCS without FSR": {
            "authors": f"{BCS}/authors-unet",
            BCS_AUTHORS: f"{BCS}/fedseg-authors-unet",
            BCS_AUG: f"{BCS}/fedseg-authors-aug-unet",
            "fedseg paper": "archive/fedbcs-nuclei-augmented-r104/fedbcs-table2-nuclei/runs/cdpa",
        },
    },
    "fedbcs-nuclei-r85": FEDBCS_R85,
    "vc-table1-polyp": FEDDP_POLYP,
}
"""Per table, per method: arm name -> folder (under docs/evidence) holding ``seed<k>``."""

CONTRASTS: dict[str, list[tuple[str, str, str]]] = {
    "fedlppa-table3": [("FedLPPA", "fedseg paper", "fedseg authors")],
    "fedbcs-table1-nuclei": [
        ("FedBCS", "fedseg paper", BCS_AUTHORS),
        ("FedBCS without FSR", "fedseg paper", BCS_AUTHORS),
    ],
    "fedbcs-nuclei-r85": [("FedBCS", "fedseg default", "fedseg, the code's clamp")],
    "vc-table1-polyp": [
        ("FedDP", "fedseg paper", "fedseg authors"),
        ("FedDP", f"fedseg paper, {SMP}", "fedseg authors"),
        ("FedDP", "fedseg authors, foreground Dice", FEDDP_V1),
        ("FedDP", "fedseg authors + the code's clamp", FEDDP_V1),
        ("FedDP", "fedseg authors, the code's decoder init", FEDDP_V1),
        ("FedDP", LOGITS, "fedseg authors"),
        ("FedAvg", "fedseg, smp's FPN init, the code's up-sampling", f"fedseg, {SMP}"),
    ],
}
"""Per table, fedseg arms paired with each other: (method, arm, against)."""

NO_VERDICT: dict[str, dict[str, str]] = {
    "fedlppa-table3": {
        "fedseg, its 8 + 2 split only": "diagnostic",
        "fedseg, SGD only": "diagnostic",
    },
    "fedbcs-table1-nuclei": {BCS_AUG: "diagnostic"},
    "vc-table1-polyp": {
        "fedseg authors, foreground Dice": "diagnostic",
        "fedseg authors + the code's clamp": "diagnostic",
        "fedseg authors, the code's decoder init": "diagnostic",
        "authors, fresh draws": "diagnostic",
        LOGITS: "diagnostic",
        "fedseg, smp's FPN init, the code's up-sampling": "diagnostic",
        FEDDP_V1: "stopped: its network superseded",
        f"fedseg, {SMP}": "stopped: its network superseded",
    },
}
"""Per table, arms that get no verdict, and why: run on seed 0 alone by design (a
*diagnostic*: one difference switched to trace a gap), or stopped before three seeds when the
network they ran on was replaced (their seeds so far stay shown). Their differences are
shown; an arm named here that has three seeds still gets its verdict."""

BUDGETS: dict[str, dict[str, object]] = {
    "fedlppa-table3": {"rounds": 40, "local_iters": 10, "batch_size": 10, "lr": 0.01},
    "fedbcs-table1-nuclei": {"rounds": 104, "local_epochs": 1, "batch_size": 6, "lr": 0.01},
    "fedbcs-nuclei-r85": {"rounds": 85, "local_epochs": 1, "batch_size": 6, "lr": 0.01},
    "vc-table1-polyp": {"rounds": 20, "batch_size": 8, "lr": 0.001},
}
"""Per table, the ``train`` settings every arm's runs must have (one budget for both sides):
a run of another budget (e.g. a kept evidence run not yet rerun) is left out."""


def seed_runs(folder: Path, budget: dict[str, object], best: bool = False) -> list[Path]:
    """The finished seed runs of an arm at ``budget`` (``best``: their ``best_round``
    selections)."""
    out = []
    for run in sorted(folder.glob("seed*")):
        chosen = run / "best_round" if best else run
        if not ((chosen / "cases.csv").is_file() and (chosen / "results.json").is_file()):
            continue
        train = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("train", {})
        if all(train.get(k) == v for k, v in budget.items()):
            out.append(chosen)
    return out


def _mean(runs: list[Path]) -> str:
    if not runs:
        return "-"
    values = arm_average(runs)
    sd = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.1f}{sd} ({len(values)})"


def _against(
    runs: list[Path], ref: list[Path], what: str, no_verdict: str | None = None
) -> tuple[str, str, str]:
    """The statistic, margin and verdict of ``runs`` against ``ref`` (matched seed counts;
    ``no_verdict``: why an arm with fewer than three seeds gets none, :data:`NO_VERDICT`)."""
    if not runs or not ref:
        return "", "", ""
    n = min(len(runs), len(ref))
    eq = compare_arms(runs[:n], ref[:n], what=what)
    p = eq.paired
    stat = f"{p.median:+.1f} [{p.low:+.1f}, {p.high:+.1f}] ({p.pairs} cases)"
    waiting = len(runs) < SEEDS or len(ref) < SEEDS
    if waiting and no_verdict:
        reason, _, why = no_verdict.partition(": ")
        why = f"; {why}" if why else ""
        return stat, f"{eq.margin:.1f}", f"{reason} ({n} seed{'s' * (n > 1)}, no verdict{why})"
    return stat, f"{eq.margin:.1f}", f"pending ({n} of {SEEDS} seeds)" if waiting else eq.verdict


def rows(table: str) -> list[str]:
    """The markdown lines of ``table``'s parity table."""
    lines = [
        "| method | arm | DSC, mean ± SD over seeds (seeds) | authors' own pick (best round on "
        "test) | vs authors: median difference [95 % CI] | margin | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    budget = BUDGETS[table]
    no_verdict = NO_VERDICT.get(table, {})
    for method, arms in TABLES[table].items():
        ref = seed_runs(EVIDENCE / arms["authors"], budget)
        for arm, folder in arms.items():
            runs = seed_runs(EVIDENCE / folder, budget)
            best = seed_runs(EVIDENCE / folder, budget, best=True)
            pick = _mean(best) if arm == "authors" else ""
            what = f"{table} {method} {arm}"
            stat, margin, verdict = (
                _against(runs, ref, what, no_verdict.get(arm)) if arm != "authors" else ("",) * 3
            )
            lines.append(
                f"| {method} | {arm} | {_mean(runs)} | {pick} | {stat} | {margin} | {verdict} |"
            )
    if table in CONTRASTS:
        lines += [
            "",
            "fedseg's arms against each other (the margin from the second arm's seeds):",
            "",
            "| method | arm | against | median difference [95 % CI] | margin | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for method, arm, against in CONTRASTS[table]:
            arms = TABLES[table][method]
            runs = seed_runs(EVIDENCE / arms[arm], budget)
            ref = seed_runs(EVIDENCE / arms[against], budget)
            what = f"{table} {method} {arm}/{against}"
            stat, margin, verdict = _against(runs, ref, what, no_verdict.get(arm))
            lines.append(f"| {method} | {arm} | {against} | {stat} | {margin} | {verdict} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", choices=sorted(TABLES))
    args = parser.parse_args()
    out = EVIDENCE / "parity" / args.table / "table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = [
        f"# Parity: {args.table}",
        "",
        "Written by `.venv/bin/python benchmarks/parity/table.py "
        f"{args.table}`; the rule is [the parity README](../README.md). DSC in points, the "
        "last round's model on both sides; differences are the arm minus the authors' code, "
        "per test case (seed means). Every run has "
        + ", ".join(f"`train.{k}` {v}" for k, v in BUDGETS[args.table].items())
        + ".",
        "",
    ]
    out.write_text("\n".join(head + rows(args.table)) + "\n")
    print(out)


if __name__ == "__main__":
    main()
