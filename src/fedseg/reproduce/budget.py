"""The evidence budget of a federation: the rounds at which a table's control rows converge.

The rule, fixed before measuring: each control row (FedAvg, and local / centralized training
where the table has them) is run at ``R`` rounds (the shipped config's, then doubled) for two
seeds with the final evaluation on the validation split; its validation DSC (mean over sites
and regions, in points) must gain less than :data:`GAIN_POINTS` from the last periodic
evaluation at or before round ``0.75 R`` to round ``R``, averaged over the seeds, and end at
:data:`MIN_DSC` points or more (a flat curve at zero has not converged, it has not started).
The first ``R`` where every control row passes is the budget (``converged``). When doubling
would exceed :data:`TABLE_HOURS` for the federation's largest table on :data:`CORES` cores
(estimated from its rows' CPU seconds per round), the largest ``R`` that fits is taken
instead (``capped``); where that ``R`` adds less than a quarter to the last attempt's (the
window the rule reads), it is the budget without an attempt of its own; the estimate uses
each row's own CPU seconds per round, measured by a :data:`PROBE_ROUNDS`-round probe of every
row of that table (a row's cost only: its numbers are never read). Only the control rows'
curves decide the budget: never a method under test.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import parse_config
from fedseg.errors import ConfigError
from fedseg.reporting.runs import read_results, read_rounds
from fedseg.reproduce.harness import (
    EVIDENCE_ROOT,
    planned_configs,
    planned_inert,
    row_config,
    slug,
)
from fedseg.reproduce.papers import PAPERS_DIR, PaperTable, load_paper
from fedseg.reproduce.runs import Job, run_jobs

__all__ = [
    "CORES",
    "GAIN_POINTS",
    "TABLE_HOURS",
    "Attempt",
    "Calibration",
    "calibrate",
    "gain",
    "inert_rows",
    "next_rounds",
    "probe_costs",
]

GAIN_POINTS = 1.0
MIN_DSC = 10.0
TABLE_HOURS = 3.0
CORES = 2
SEEDS_PER_TABLE = 3
DOUBLINGS = 4
PROBE_ROUNDS = 3
"""Rounds of a cost probe; the last is timed: learnable aggregation (FedALA, FedICRA, FedLPPA's
LA) trains its weights until they settle in its first round with a global model (the second),
which later rounds do not repeat."""
RULE = (
    f"validation DSC of every control row gains < {GAIN_POINTS:g} point over the last quarter "
    f"of the rounds and ends at >= {MIN_DSC:g} points (means over 2 seeds)"
)


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """(round, validation DSC in points) of a calibration run: its periodic evaluations and
    the final one (on the validation split)."""
    points = []
    for rec in read_rounds(run_dir):
        if rec.get("eval"):
            values = [v for site in rec["eval"].values() for v in site.values()]
            points.append((int(rec["round"]) + 1, 100 * statistics.fmean(values)))
    results = read_results(run_dir / "results.json")
    final = [float(v) for v in results["average"]["dsc"].values()]
    rounds = len(results["timing"]["round_seconds"])
    points.append((rounds, 100 * statistics.fmean(final)))
    return points


def gain(points: Sequence[tuple[int, float]]) -> float:
    """Validation DSC at the last round minus at the last evaluation at or before 3/4 of it."""
    last_round, last = points[-1]
    earlier = [v for r, v in points if r <= math.floor(0.75 * last_round)]
    if not earlier:
        raise ConfigError(f"no evaluation at or before round {0.75 * last_round:g}")
    return last - earlier[-1]


@dataclass
class Attempt:
    """The control rows at one number of rounds."""

    rounds: int
    curves: dict[str, list[list[tuple[int, float]]]] = field(default_factory=dict)
    cpu_per_round: dict[str, float] = field(default_factory=dict)

    def gains(self) -> dict[str, float]:
        """Per control row, the mean gain over seeds."""
        return {row: statistics.fmean(gain(c) for c in cs) for row, cs in self.curves.items()}

    def finals(self) -> dict[str, float]:
        """Per control row, the mean validation DSC at the last round."""
        return {row: statistics.fmean(c[-1][1] for c in cs) for row, cs in self.curves.items()}

    def converged(self) -> bool:
        """Whether every control row passes the rule."""
        gains, finals = self.gains(), self.finals()
        return all(gains[r] < GAIN_POINTS and finals[r] >= MIN_DSC for r in gains)


@dataclass
class Calibration:
    """The attempts at one federation and the budget they give."""

    paper: str
    table: PaperTable
    row_cpu: dict[str, float]
    """CPU seconds per round of each row of the federation's largest table (its probe)."""
    attempts: list[Attempt]
    folder: Path
    fixed: dict[str, Any] = field(default_factory=dict)
    """Overrides the budget holds besides the rounds (``--set``, e.g. a smaller image size)."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Rows of the largest table left out of the estimate: a check of their config finds
    their mechanism inert at this size, so they do not run here (label -> the measurement)."""
    done: bool = False
    """Whether the search has ended (no larger attempt follows)."""
    capped_at: int | None = None
    """The budget's rounds where the cap binds a little past the last attempt: the most that
    fit, not run (an attempt at them would nearly copy the last one)."""

    @property
    def rounds(self) -> int:
        """The budget: the last attempt's rounds, or :attr:`capped_at`."""
        return self.capped_at or self.attempts[-1].rounds

    @property
    def status(self) -> str:
        """``converged``, ``capped`` (ended without converging) or ``measuring``."""
        if self.attempts[-1].converged():
            return "converged"
        return "capped" if self.done else "measuring"

    def table_hours(self, rounds: int) -> float:
        """Estimated wall hours of the federation's largest table at ``rounds`` (3 seeds, each
        row's CPU seconds per round, :data:`CORES` runs at a time; evaluations not counted)."""
        return sum(self.row_cpu.values()) * rounds * SEEDS_PER_TABLE / CORES / 3600

    def snippet(self) -> dict[str, Any]:
        """The ``evidence_budget`` entry of the paper file."""
        return {
            self.table.federation: {
                "set": {**self.fixed, "train.rounds": self.rounds},
                "status": self.status,
                "rule": RULE,
                "controls": list(self.table.controls),
                "measured_on": self.table.name,
                "gains": {
                    str(a.rounds): {k: round(v, 2) for k, v in a.gains().items()}
                    for a in self.attempts
                },
                "final_val_dsc": {
                    str(a.rounds): {k: round(v, 2) for k, v in a.finals().items()}
                    for a in self.attempts
                },
                "table_hours": round(self.table_hours(self.rounds), 1),
                "curve": f"docs/evidence/budgets/{self.folder.name}/curve.csv",
            }
        }

    def report(self) -> str:
        """Markdown: the rule, each attempt's gains, the budget and the paper-file entry."""
        lines = [
            f"# Evidence budget of `{self.table.federation}` ({self.paper}, measured on "
            f"{self.table.name})",
            "",
            f"Rule: {RULE}. Controls: {', '.join(self.table.controls)}."
            + (
                " Fixed for this federation besides the rounds: "
                + ", ".join(f"`{k}: {v}`" for k, v in self.fixed.items())
                + "."
                if self.fixed
                else ""
            ),
            "",
            "| rounds | "
            + " | ".join(f"gain {r}" for r in self.table.controls)
            + " | CPU s per round | converged |",
            "|---|" + "---|" * (len(self.table.controls) + 2),
        ]
        for a in self.attempts:
            g, f = a.gains(), a.finals()
            cpu = statistics.fmean(a.cpu_per_round.values())
            lines.append(
                f"| {a.rounds} | "
                + " | ".join(f"{g[r]:.2f} / {f[r]:.2f}" for r in self.table.controls)
                + f" | {cpu:.1f} | {'yes' if a.converged() else 'no'} |"
            )
        left_out = [f"- {row}: {why}" for row, why in self.left_out.items()]
        beyond = (
            f" (the most rounds that fit, {self.capped_at - self.attempts[-1].rounds} past the "
            "last attempt: less than a quarter more, so not run as an attempt of their own)"
            if self.capped_at
            else ""
        )
        lines += [
            "",
            f"Budget: `train.rounds: {self.rounds}` ({self.status}){beyond}; estimated "
            f"{self.table_hours(self.rounds):.1f} h for the largest table of this federation "
            f"({len(self.row_cpu)} rows, {SEEDS_PER_TABLE} seeds, {CORES} cores), from each "
            f"row's CPU seconds per round (a {PROBE_ROUNDS}-round probe):",
            "",
            "| row | CPU s per round |",
            "|---|---|",
            *(f"| {row} | {cpu:.1f} |" for row, cpu in self.row_cpu.items()),
            "",
            *(
                [
                    "Left out of the estimate (inert at this size, so not run here):",
                    "",
                    *left_out,
                    "",
                ]
                if left_out
                else []
            ),
            "Paper-file entry (`evidence_budget:`):",
            "",
            "```yaml",
            yaml.safe_dump(self.snippet(), sort_keys=False).rstrip(),
            "```",
            "",
        ]
        return "\n".join(lines)

    def record(self, paper_file: Path) -> None:
        """Write the budget into ``paper_file``'s ``evidence_budget:`` block (kept last in the
        file; other federations' entries stay)."""
        lines = paper_file.read_text().splitlines()
        start = next((i for i, x in enumerate(lines) if x.startswith("evidence_budget:")), None)
        if start is None:
            block: dict[str, Any] = {}
            head = lines
        else:
            end = next(
                (i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "#")),
                len(lines),
            )
            if end != len(lines):
                raise ConfigError(f"{paper_file}: evidence_budget must be the last block")
            block = yaml.safe_load("\n".join(lines[start:end]))["evidence_budget"] or {}
            head = lines[:start]
        block.update(self.snippet())
        text = yaml.safe_dump({"evidence_budget": block}, sort_keys=False, width=100)
        paper_file.write_text("\n".join(head).rstrip("\n") + "\n" + text)

    def write(self) -> None:
        """budget.md, curve.csv and curve.png in the calibration folder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "budget.md").write_text(self.report())
        rows = ["rounds,row,seed,round,val_dsc"]
        for a in self.attempts:
            for row, cs in a.curves.items():
                for seed, c in enumerate(cs):
                    rows += [f"{a.rounds},{row},{seed},{r},{v:.4f}" for r, v in c]
        (self.folder / "curve.csv").write_text("\n".join(rows) + "\n")
        _plot(self, self.folder / "curve.png")


def _plot(cal: Calibration, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cal.attempts), figsize=(4 * len(cal.attempts), 3.2))
    for ax, a in zip(list(axes) if len(cal.attempts) > 1 else [axes], cal.attempts, strict=True):
        for i, (row, cs) in enumerate(a.curves.items()):
            for c in cs:
                ax.plot(*zip(*c, strict=True), color=f"C{i}", alpha=0.8, label=row)
        ax.axvline(0.75 * a.rounds, color="grey", ls=":")
        ax.set_title(f"{a.rounds} rounds")
        ax.set_xlabel("round")
        ax.set_ylabel("validation DSC")
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(dict(zip(labels, handles, strict=True)).values(), dict.fromkeys(labels))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def next_rounds(rounds: int, fits: int) -> int | None:
    """The attempt after an unconverged one at ``rounds``: doubled, or the most rounds that fit
    the time cap (``fits``); ``None`` where that adds less than a quarter of ``rounds``, the
    window the rule reads (an attempt nearly copying the last measures nothing new; the cap,
    ``fits`` where more than ``rounds``, is then the budget)."""
    step = min(2 * rounds, fits)
    return step if step >= rounds + max(1, rounds // 4) else None


def fixed_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` items (YAML values) as the fixed part of a budget."""
    fixed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key.sub=value")
        fixed[key] = yaml.safe_load(value)
    return fixed


def inert_rows(table: PaperTable, fixed: dict[str, Any]) -> dict[str, str]:
    """Rows of ``table`` that a check of the config alone (:data:`~.protocol.FROM_CONFIG`)
    finds inert at the budget's ``fixed`` overrides (label -> the measurement)."""
    return planned_inert(table, planned_configs(table, "evidence", fixed, ()))


def probe_costs(
    table: PaperTable,
    fixed: dict[str, Any],
    folder: Path,
    out: Path,
    on_run: Callable[[str, dict[str, Any], float], None] | None = None,
    workers: int = 1,
    skip: Collection[str] = (),
) -> dict[str, float]:
    """CPU seconds of the last of :data:`PROBE_ROUNDS` training rounds (seed 0, shipped
    config with the budget's ``fixed`` overrides) of each row of ``table`` but those in
    ``skip``; the probes' small files are kept in ``folder/probes`` and reused."""
    rows = [row for row in table.rows if row.label not in skip]
    jobs = []
    for row in rows:
        raw, path = row_config(row, "evidence", fixed, ())
        raw.setdefault("train", {})["rounds"] = PROBE_ROUNDS
        raw["eval"] = {**(raw.get("eval") or {}), "every": PROBE_ROUNDS, "split": "val"}
        name = Path("probes") / slug(row.label)
        jobs.append(Job(raw, str(path), out / name, folder / name))
    costs = {}
    for f in run_jobs(jobs, workers):
        label = rows[f.index].label
        if on_run and not f.reused:
            on_run(f"{label}: cost probe", f.results, sum(f.results["timing"]["round_seconds"]))
        costs[label] = float(f.results["timing"]["round_cpu_seconds"][-1])
    return {row.label: costs[row.label] for row in rows}


def calibrate(
    paper: str,
    table: str,
    seeds: int = 2,
    overrides: Sequence[str] = (),
    out: Path | None = None,
    on_run: Callable[[str, dict[str, Any], float], None] | None = None,
    folder: Path | None = None,
    workers: int = 1,
) -> Calibration:
    """Run ``table``'s control rows at the shipped rounds (fewer where the federation's
    largest table would not fit the time cap), then doubled, until the rule holds or the cap
    binds; ``overrides`` (``key=value``) are fixed parts of the budget, applied to every run
    and recorded beside the rounds. Write budget.md, curve.csv and curve.png to
    ``folder`` (default ``docs/evidence/budgets/<paper>-<federation>/``) with each run's small
    files there, which later calls reuse, and record the budget in the paper file
    (``fedseg/papers/<paper>.yaml``, ``evidence_budget``). ``workers`` > 1 runs that many
    runs of an attempt at once (:func:`~fedseg.reproduce.runs.run_jobs`)."""
    p = load_paper(paper)
    t = p.table(table)
    if not t.controls or not t.federation:
        raise ConfigError(f"table {table!r} of {paper} names no federation or control rows")
    largest = max(
        (x for x in p.tables.values() if x.federation == t.federation), key=lambda x: len(x.rows)
    )
    folder = folder or EVIDENCE_ROOT / "budgets" / f"{paper}-{t.federation}"
    out = out or Path("runs") / "calibrate" / f"{paper}-{t.federation}"
    fixed = fixed_overrides(overrides)
    left_out = inert_rows(largest, fixed)
    costs = probe_costs(largest, fixed, folder, out, on_run, workers, skip=left_out)
    raws = {row: row_config(t.row(row), "evidence", fixed, ()) for row in t.controls}
    cal = Calibration(paper, t, costs, [], folder, fixed, left_out)
    shipped = int(parse_config(copy.deepcopy(raws[t.controls[0]][0])).train.rounds)
    rounds = max(1, min(shipped, int(TABLE_HOURS / cal.table_hours(1))))
    for _ in range(DOUBLINGS + 1):
        attempt = Attempt(rounds)
        jobs, owner = [], []
        for row, (raw, path) in raws.items():
            for k in range(seeds):
                run_raw = copy.deepcopy(raw)
                run_raw["seed"] = int(raw.get("seed", 0)) + k
                run_raw.setdefault("train", {})["rounds"] = rounds
                run_raw["eval"] = {**(run_raw.get("eval") or {}), "every": max(1, rounds // 20)}
                run_raw["eval"]["split"] = "val"
                name = f"r{rounds}/{slug(row)}/seed{run_raw['seed']}"
                jobs.append(Job(run_raw, str(path), out / name, folder / "runs" / name))
                owner.append(row)
        finished = {}
        for f in run_jobs(jobs, workers):
            finished[f.index] = f
            if on_run:
                seed = jobs[f.index].raw["seed"]
                seconds = sum(f.results["timing"]["round_seconds"])
                on_run(f"{owner[f.index]} at {rounds} rounds (seed {seed})", f.results, seconds)
        for row in raws:
            mine = [finished[i] for i, r in enumerate(owner) if r == row]
            attempt.curves[row] = [curve(f.run_dir) for f in mine]
            attempt.cpu_per_round[row] = statistics.fmean(
                statistics.fmean(f.results["timing"]["round_cpu_seconds"]) for f in mine
            )
        cal.attempts.append(attempt)
        cal.write()
        if attempt.converged():
            break
        fits = int(TABLE_HOURS / cal.table_hours(1))
        step = next_rounds(rounds, fits)
        if step is None:
            cal.capped_at = fits if fits > rounds else None
            break
        rounds = step
    cal.done = True
    cal.write()
    cal.record(PAPERS_DIR / f"{paper}.yaml")
    return cal
