"""How a paper trains beside how its evidence runs train (a table's protocol sheet), what a
forced difference would cost, and measurements of whether a method's mechanism still acts
at the evidence size (docs/reproduce.md#protocol-sheets).

A table's ``protocol`` in its paper file lists every :data:`ASPECTS` item once: the paper's
setting (``not stated`` where the paper is silent), ours, the config keys whose values the
evidence runs recorded, and a status: ``same``, ``forced`` (the evidence size, budget or
synthetic data need it; ``cost`` says how much more the paper's setting would take, as a
factor on the table's measured CPU time, where CPU time is what stands in the way),
``unforced`` (a difference removed from the config: the table's ``changed`` date says
since when its rows wait for a rerun) or ``not stated``.
A table's ``mechanisms`` name a measurement (:data:`MEASURES`) over the rows' kept
``rounds.jsonl`` records (or their configs, :data:`FROM_CONFIG`) and the bound under which
the mechanism counts as inert: the claims on such rows get no verdict ("not testable at this size").
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, model_validator

from fedseg.errors import ConfigError

__all__ = [
    "ASPECTS",
    "FROM_CONFIG",
    "MEASURES",
    "NOT_TESTABLE",
    "Changed",
    "Cost",
    "Measurement",
    "Mechanism",
    "ProtocolItem",
    "inert",
    "inert_labels",
    "measure",
    "parse_protocol",
]

NOT_TESTABLE = "not testable at this size"
"""The verdict of a claim whose rows' mechanism is measured inert at the evidence size."""

ASPECTS = (
    "local work per round",
    "batch size",
    "optimiser",
    "learning rate and schedule",
    "rounds",
    "input size",
    "data and split",
    "validation use",
    "pretraining",
    "augmentation",
    "model selection",
)
"""What every protocol sheet states, in this order."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cost(_Strict):
    """What the paper's setting would take: ``factor`` times the table's measured CPU time;
    or, with ``per`` (a config key the CPU time grows with linearly, e.g. ``train.rounds``),
    the paper's value of that key over the one the kept runs recorded."""

    factor: PositiveFloat | None = None
    basis: str = ""
    """How the factor follows from the two settings (e.g. ``(384/64)^2 pixels``)."""
    per: str = ""
    paper: PositiveFloat | None = None
    """The paper's value of ``per``."""

    @model_validator(mode="after")
    def _one_form(self) -> Cost:
        by_key = bool(self.per)
        if (self.factor is None) != by_key or (self.paper is None) == by_key:
            raise ValueError("expected either 'factor' and 'basis', or 'per' and 'paper'")
        if self.factor is not None and not self.basis:
            raise ValueError("a 'factor' needs its 'basis'")
        return self


class ProtocolItem(_Strict):
    """One aspect of training: the paper's setting beside the evidence runs'."""

    aspect: Literal[ASPECTS]  # type: ignore[valid-type]
    paper: str = Field(min_length=1)
    ours: str = Field(min_length=1)
    status: Literal["same", "forced", "unforced", "not stated"]
    keys: tuple[str, ...] = ()
    """Config keys (``train.lr``) whose values the evidence runs recorded, shown beside ours."""
    cost: Cost | None = None
    why: str = ""

    @model_validator(mode="after")
    def _forced_has_cost(self) -> ProtocolItem:
        if self.status == "forced" and not self.why:
            raise ValueError("a forced difference needs 'why' (and 'cost' where it is CPU time)")
        return self


class Changed(_Strict):
    """The table's config changed after its runs: the rows wait for a rerun."""

    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    what: str = Field(min_length=1)


class Mechanism(_Strict):
    """A measurement of whether ``rows``' mechanism acts, and when it counts as inert."""

    id: str = Field(min_length=1)
    what: str = Field(min_length=1)
    rows: tuple[str, ...] = Field(min_length=1)
    measure: str
    inert_below: float | None = None
    """The rows are inert where the measured value is below this (None: measured only)."""
    needs: str = ""
    """What the design needs and what that costs (rendered with the measurement)."""

    @model_validator(mode="after")
    def _known_measure(self) -> Mechanism:
        if self.measure not in MEASURES:
            raise ValueError(f"measure {self.measure!r}: expected one of {', '.join(MEASURES)}")
        return self


def _check(model: type[BaseModel], raw: Any, where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}{'.' + loc if loc else ''}: {err['msg']}") from None


def parse_protocol(
    raw: Mapping[str, Any], where: str, rows: set[str]
) -> tuple[tuple[ProtocolItem, ...], Changed | None, tuple[Mechanism, ...]]:
    """A table's ``protocol`` (every aspect once, in :data:`ASPECTS` order), ``changed`` and
    ``mechanisms`` from its paper file; ConfigError naming the field otherwise."""
    items = tuple(
        _check(ProtocolItem, item, f"{where}.protocol[{i}]")
        for i, item in enumerate(raw.get("protocol") or [])
    )
    if items and tuple(i.aspect for i in items) != ASPECTS:
        raise ConfigError(
            f"{where}.protocol: expected each aspect once, in order: {', '.join(ASPECTS)}"
        )
    changed = _check(Changed, raw["changed"], f"{where}.changed") if raw.get("changed") else None
    if any(i.status == "unforced" for i in items) and changed is None:
        raise ConfigError(
            f"{where}: an unforced difference must be removed: change the config and say when "
            "in 'changed' (date, what)"
        )
    mechanisms = tuple(
        _check(Mechanism, m, f"{where}.mechanisms[{i}]")
        for i, m in enumerate(raw.get("mechanisms") or [])
    )
    for i, m in enumerate(mechanisms):
        if unknown := sorted(set(m.rows) - rows):
            raise ConfigError(f"{where}.mechanisms[{i}].rows: no row {unknown[0]!r} in this table")
    return items, changed, mechanisms


@dataclass(frozen=True)
class Measurement:
    """A mechanism measured on one row's runs: the headline value and what it says."""

    value: float
    text: str


def _records(run: Path) -> list[dict[str, Any]]:
    path = run / "rounds.jsonl"
    if not path.is_file():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _second_half(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return records[len(records) // 2 :]


def _live_codes(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """Codebook entries in use at the last round, mean over sites and seeds."""
    live, size = [], 0.0
    for run in runs:
        last = _records(run)[-1]["clients"].values()
        live += [c["vq_codes"] - c["vq_dead_codes"] for c in last if "vq_codes" in c]
        size = max([size] + [c["vq_codes"] for c in last if "vq_codes" in c])
    if not live:
        return Measurement(math.nan, "no codebook usage recorded")
    value = statistics.fmean(live)
    return Measurement(
        value, f"{value:.1f} of {size:.0f} codes in use at the last round (mean over sites, seeds)"
    )


def _bottleneck(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """Tokens per side of the bottleneck's smallest in-plane axis (input / 2^(levels-1))."""
    from fedseg.data.synth.base import SYNTH_TASKS

    cfg = configs[0]
    synth = cfg["data"].get("synth") or {}
    if not synth:
        return Measurement(math.nan, "not a synthetic federation: input size not recorded")
    shape = SYNTH_TASKS.get(synth["task"]).spatial_shape(int(synth["size"]))
    down = 2 ** (len(cfg["model"].get("widths") or [0] * 5) - 1)
    grid = [max(1, s // down) for s in shape]
    tokens = math.prod(grid)
    text = (
        f"input {' x '.join(map(str, shape))}: bottleneck {' x '.join(map(str, grid))} "
        f"= {tokens} tokens per branch"
    )
    return Measurement(float(min(grid[-2:])), text)


def _clusters(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """Mean FINCH clusters per class and level, and the rounds that kept one per class."""
    counts, single, rounds = [], 0, 0
    for run in runs:
        for r in _records(run):
            found = (r.get("server") or {}).get("clusters")
            if not found:
                continue
            rounds += 1
            sizes = [n for level in found.values() for n in level]
            single += all(n == 1 for n in sizes)
            counts += sizes
    if not counts:
        return Measurement(math.nan, "no clusters recorded")
    value = statistics.fmean(counts)
    return Measurement(
        value,
        f"{value:.2f} clusters per class and level (mean over rounds, seeds); one per class at "
        f"every level in {single} of {rounds} rounds",
    )


def _aaw(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """The AAW weights' spread: in the second half of the rounds, the share of rounds with a
    site at weight < 1e-3, and each site's final weight (mean over seeds)."""
    zero, rounds, final = 0, 0, {}
    for run in runs:
        records = _records(run)
        for r in _second_half(records):
            w = (r.get("server") or {}).get("aaw_weights")
            if w:
                rounds += 1
                zero += any(v < 1e-3 for v in w.values())
        for site, v in ((records[-1].get("server") or {}).get("aaw_weights") or {}).items():
            final.setdefault(site, []).append(v)
    if not rounds:
        return Measurement(math.nan, "no AAW weights recorded")
    weights = {s: statistics.fmean(v) for s, v in final.items()}
    spread = max(weights.values()) - min(weights.values())
    listing = ", ".join(f"{s} {v:.3f}" for s, v in weights.items())
    return Measurement(
        spread,
        f"final weights {listing}; a site at weight < 0.001 in {zero} of {rounds} "
        "second-half rounds",
    )


def _aux_weights(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """How far FedLPPA's auxiliary-decoder aggregation weights lie from the plain average
    (1/N), and the prompt affinity's drift, over the second half (late) of the rounds."""
    gaps, drift = [], []
    for run in runs:
        for r in _second_half(_records(run)):
            server = r.get("server") or {}
            w = server.get("aux_weights")
            if w:
                w = json.loads(w) if isinstance(w, str) else w
                n = len(w)
                gaps.append(max(abs(float(x) - 1 / n) for row in w for x in row))
            if "affinity_drift" in server:
                drift.append(float(server["affinity_drift"]))
    if not gaps:
        return Measurement(math.nan, "no auxiliary aggregation weights recorded")
    value = statistics.fmean(gaps)
    text = (
        f"largest distance of a weight from 1/N {value:.3f} (mean over second-half rounds, seeds)"
    )
    if drift:
        text += f"; prompt affinity drift {statistics.fmean(drift):.4f} per round"
    return Measurement(value, text)


def _la_rounds(runs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> Measurement:
    """Rounds in which FedLPPA's learnable aggregation (LA) took a step at any site, mean
    over seeds, beside the rounds run and the warm-up the config sets (``la_skip_rounds``)."""
    acted, total = [], []
    for run in runs:
        records = _records(run)
        total.append(len(records))
        acted.append(
            sum(any(c.get("la_steps", 0) > 0 for c in r["clients"].values()) for r in records)
        )
    if not total:
        return Measurement(math.nan, "no rounds recorded")
    value = statistics.fmean(acted)
    skip = {(c.get("method") or {}).get("la_skip_rounds") for c in configs} - {None}
    warm = f"; warm-up {', '.join(map(str, sorted(skip)))} rounds" if skip else ""
    rounds = statistics.fmean(total)
    return Measurement(value, f"LA acted in {value:g} of {rounds:g} rounds (mean over seeds){warm}")


MEASURES: dict[str, Callable[[Sequence[Path], Sequence[Mapping[str, Any]]], Measurement]] = {
    "vq_live_codes": _live_codes,
    "bottleneck_side": _bottleneck,
    "finch_clusters": _clusters,
    "aaw_weights": _aaw,
    "aux_weights": _aux_weights,
    "la_rounds": _la_rounds,
}
"""Measurement name -> function of a row's kept run folders and resolved configs."""

FROM_CONFIG = frozenset({"bottleneck_side"})
"""Measurements that read the config alone: a row without runs is measured on the config
it would run (so a row known inert at the evidence size need not be trained to say so)."""


def measure(
    mechanism: Mechanism,
    rows: Mapping[str, tuple[Sequence[Path], Sequence[Mapping[str, Any]]]],
    planned: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Measurement]:
    """``mechanism`` measured on each of its rows that has runs (``rows``: label -> kept run
    folders and their configs); for a :data:`FROM_CONFIG` measurement, also on each row
    without runs whose resolved config ``planned`` holds."""
    fn = MEASURES[mechanism.measure]
    out = {}
    for label in mechanism.rows:
        runs, configs = rows.get(label, ((), ()))
        if runs:
            out[label] = fn(runs, configs)
        elif mechanism.measure in FROM_CONFIG and label in (planned or {}):
            m = fn((), (planned[label],))
            out[label] = Measurement(m.value, f"{m.text} (the planned config; not run)")
    return out


def inert_labels(
    mechanisms: Sequence[Mechanism], found: Iterable[Mapping[str, Measurement]]
) -> dict[str, str]:
    """The rows any of ``mechanisms`` (each with its rows' measurements in ``found``, in the
    same order) measures inert, each with its measurements joined."""
    out: dict[str, str] = {}
    for m, rows in zip(mechanisms, found, strict=True):
        for label, why in inert(m, rows).items():
            out[label] = f"{out[label]}; {why}" if label in out else why
    return out


def inert(mechanism: Mechanism, found: Mapping[str, Measurement]) -> dict[str, str]:
    """The rows measured inert (value below ``inert_below``), each with its measurement."""
    if mechanism.inert_below is None:
        return {}
    return {
        label: f"{mechanism.what}: {m.text} (< {mechanism.inert_below:g})"
        for label, m in found.items()
        if m.value < mechanism.inert_below
    }
