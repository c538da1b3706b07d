"""The papers' tables: which shipped config each row runs, the numbers the paper published and
the claims its results section makes about them.

One YAML file per paper in ``fedseg/papers/`` (package data). A table names its published
``columns``; each row has a ``label``, the shipped ``config`` it runs (or the table's
``base``), ``set`` overrides (``key.sub=value``, applied after the table's own ``set``) and
the ``published`` values in column order (``null`` where the paper gives none). A table also
names its ``federation`` (the key of its ``evidence_budget``), its ``controls`` (rows that
choose the budget), its ``reference`` rows (every row is compared with them) and its
``claims`` (docs/reproduce.md#claims), and its ``protocol`` sheet, ``changed`` date and
``mechanisms`` checks (:mod:`fedseg.reproduce.protocol`, docs/reproduce.md#protocol-sheets).
A paper names the ``distance_unit`` its runs' distances are in (``px``, or ``mm`` where the
synthetic volumes carry a voxel spacing) and how its averages weigh the sites (``average``:
``sites``, each site once, or ``cases``, each site by its test cases).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fedseg.errors import ConfigError
from fedseg.reproduce.protocol import Changed, Mechanism, ProtocolItem, parse_protocol

__all__ = [
    "AVERAGES",
    "PAPERS_DIR",
    "Claim",
    "EvidenceBudget",
    "Paper",
    "PaperRow",
    "PaperTable",
    "list_papers",
    "load_paper",
]

PAPERS_DIR = Path(__file__).resolve().parent.parent / "papers"
"""Where the papers' tables live (``fedseg/papers/<paper>.yaml``)."""
AVERAGES = {"sites": "average", "cases": "weighted_average"}
"""A paper's ``average`` -> the key of a run's results.json that holds it."""


@dataclass(frozen=True)
class PaperRow:
    """One row of a paper table: what to run and what the paper reports for it."""

    label: str
    config: str
    overrides: tuple[str, ...] = ()
    published: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class Claim:
    """A comparative statement of the paper about rows of one table, fixed before any run.

    ``kind`` is ``better`` (every row of ``rows`` beats every row of ``others`` in the metric's
    own direction) or ``close`` (each pair differs by less than ``within``, in the paper's
    units: percentage points for overlaps, the paper's unit for distances)."""

    id: str
    says: str
    source: str
    metric: str
    kind: str
    rows: tuple[str, ...]
    others: tuple[str, ...]
    within: float | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """The (row, other) comparisons the claim stands on."""
        return [(a, b) for a in self.rows for b in self.others]


@dataclass(frozen=True)
class EvidenceBudget:
    """The budget at which a federation's control rows have converged (measured once)."""

    overrides: dict[str, Any]
    status: str
    """``converged`` (the rule holds) or ``capped`` (the largest budget that fits the time cap)."""
    rule: str
    measured: dict[str, Any] = field(default_factory=dict)
    """The rule's numbers: gains per control row, rounds tried, the curve's file."""


@dataclass(frozen=True)
class Parity:
    """Where a table's parity arms are (the authors' own code on the same federation):
    ``runs``, a folder under docs/evidence, and per row label its arm's folder there."""

    runs: str
    rows: Mapping[str, str]


@dataclass(frozen=True)
class PaperTable:
    """A table of a paper: its published columns, rows, controls and claims."""

    name: str
    title: str
    source: str
    """Where the published numbers are: authors, venue, section and table of the paper."""
    columns: tuple[str, ...]
    rows: tuple[PaperRow, ...]
    federation: str | None = None
    controls: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    claims: tuple[Claim, ...] = ()
    paper_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per metric, the published columns of the task our rows run (where several match)."""
    notes: tuple[str, ...] = ()
    """What a reader of the evidence page must know about how our rows differ from the
    paper's (rendered under the table)."""
    protocol: tuple[ProtocolItem, ...] = ()
    """The paper's training beside the evidence runs', aspect by aspect."""
    changed: Changed | None = None
    """When the table's config changed after its runs (its rows wait for a rerun)."""
    mechanisms: tuple[Mechanism, ...] = ()
    """Checks that a method's mechanism still acts at the evidence size."""
    parity: Parity | None = None
    """The authors'-code arms that stand in for some rows (:mod:`fedseg.reproduce.parity`)."""

    def forced(self) -> list[ProtocolItem]:
        """The protocol's forced differences (what every verdict of the table depends on)."""
        return [i for i in self.protocol if i.status == "forced"]

    def row(self, label: str) -> PaperRow:
        """The row labelled ``label``."""
        for r in self.rows:
            if r.label == label:
                return r
        raise ConfigError(f"table {self.name!r} has no row {label!r}")


@dataclass(frozen=True)
class Paper:
    """A paper's tables, the metrics we report beside them and its budgets."""

    name: str
    title: str
    metrics: tuple[str, ...]
    paper_budget: dict[str, Any]
    tables: dict[str, PaperTable] = field(default_factory=dict)
    evidence_budgets: dict[str, EvidenceBudget] = field(default_factory=dict)
    distance_unit: str = "px"
    """The unit of the runs' distance metrics (HD95, HD, ASSD): ``px`` or ``mm``."""
    average: str = "sites"
    """How a table cell averages the sites, as the paper does: ``sites`` (each site once) or
    ``cases`` (each site weighted by its test cases: the runs' ``weighted_average``)."""

    def table(self, name: str) -> PaperTable:
        """The table ``name``; ConfigError listing the paper's tables otherwise."""
        if name not in self.tables:
            raise ConfigError(
                f"paper {self.name!r} has no table {name!r}; tables: {', '.join(self.tables)}"
            )
        return self.tables[name]


def list_papers() -> list[str]:
    """Names of the papers with tables (``fedseg reproduce --list``)."""
    return sorted(p.stem for p in PAPERS_DIR.glob("*.yaml"))


def _labels(value: Any, where: str, known: set[str]) -> tuple[str, ...]:
    labels = (value,) if isinstance(value, str) else tuple(value or ())
    if not labels:
        raise ConfigError(f"{where}: expected a row label or a list of them")
    for label in labels:
        if label not in known:
            raise ConfigError(
                f"{where}: no row {label!r} in this table (rows: {', '.join(sorted(known))})"
            )
    return labels


def _claim(raw: dict[str, Any], where: str, known: set[str], metrics: tuple[str, ...]) -> Claim:
    for key in ("id", "says", "source", "metric"):
        if not raw.get(key):
            raise ConfigError(f"{where}: needs {key!r}")
    if raw["metric"] not in metrics:
        raise ConfigError(
            f"{where}: metric {raw['metric']!r} is not one of the paper's ({', '.join(metrics)})"
        )
    if "better" in raw:
        kind, rows, others, within = "better", raw["better"], raw.get("than"), None
        if "close" in raw or "within" in raw:
            raise ConfigError(f"{where}: a claim is either better/than or close/to/within")
    elif "close" in raw:
        kind, rows, others, within = "close", raw["close"], raw.get("to"), raw.get("within")
        if not isinstance(within, int | float) or within <= 0:
            raise ConfigError(f"{where}: close/to needs a positive margin 'within'")
    else:
        raise ConfigError(f"{where}: expected better/than or close/to/within")
    a = _labels(rows, f"{where}.{kind}", known)
    b = _labels(others, f"{where}.{'than' if kind == 'better' else 'to'}", known)
    return Claim(raw["id"], raw["says"], raw["source"], raw["metric"], kind, a, b, within)


def _table(path: Path, tname: str, t: dict[str, Any], metrics: tuple[str, ...]) -> PaperTable:
    columns = tuple(t.get("columns", []))
    rows = []
    for i, r in enumerate(t["rows"]):
        config = r.get("config", t.get("base"))
        published = tuple(r.get("published", ()))
        where = f"{path}: tables.{tname}.rows[{i}]"
        if config is None:
            raise ConfigError(f"{where}: needs a config (or the table a base)")
        if published and len(published) != len(columns):
            raise ConfigError(
                f"{where}: published has {len(published)} values for {len(columns)} columns"
            )
        overrides = tuple(t.get("set", [])) + tuple(r.get("set", []))
        rows.append(PaperRow(r["label"], config, overrides, published))
    known = {r.label for r in rows}
    if len(known) != len(rows):
        raise ConfigError(f"{path}: tables.{tname}: row labels must be unique")
    where = f"{path}: tables.{tname}"
    claims = tuple(
        _claim(c, f"{where}.claims[{i}]", known, metrics) for i, c in enumerate(t.get("claims", []))
    )
    controls = _labels(t["controls"], f"{where}.controls", known) if t.get("controls") else ()
    reference = (
        _labels(t["reference"], f"{where}.reference", known)
        if t.get("reference")
        else (rows[0].label,)
    )
    paper_columns = {}
    for metric, cols in (t.get("paper_columns") or {}).items():
        cols = (cols,) if isinstance(cols, str) else tuple(cols)
        if metric not in metrics or not set(cols) <= set(columns):
            raise ConfigError(
                f"{where}.paper_columns.{metric}: expected one of the paper's metrics mapped to "
                f"columns of this table ({', '.join(columns)})"
            )
        paper_columns[metric] = cols
    notes = t.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ConfigError(f"{where}.notes: expected a list of sentences")
    protocol, changed, mechanisms = parse_protocol(t, where, known)
    parity = _parity(t.get("parity"), f"{where}.parity", known)
    return PaperTable(
        tname,
        t["title"],
        t["source"],
        columns,
        tuple(rows),
        t.get("federation"),
        controls,
        reference,
        claims,
        paper_columns,
        tuple(notes),
        protocol,
        changed,
        mechanisms,
        parity,
    )


def _parity(raw: Any, where: str, known: set[str]) -> Parity | None:
    if raw is None:
        return None
    rows = raw.get("rows") if isinstance(raw, dict) else None
    if not isinstance(raw.get("runs") if isinstance(raw, dict) else None, str) or not (
        isinstance(rows, dict) and rows and all(isinstance(v, str) for v in rows.values())
    ):
        raise ConfigError(f"{where}: expected {{runs: <folder>, rows: {{<row label>: <arm>}}}}")
    _labels(list(rows), f"{where}.rows", known)
    return Parity(raw["runs"], dict(rows))


def _budget(raw: dict[str, Any], where: str) -> EvidenceBudget:
    if not isinstance(raw.get("set"), dict) or raw.get("status") not in ("converged", "capped"):
        raise ConfigError(f"{where}: needs 'set' (overrides) and 'status' (converged | capped)")
    return EvidenceBudget(dict(raw["set"]), raw["status"], raw.get("rule", ""), raw)


@cache
def load_paper(name: str) -> Paper:
    """Read and check ``fedseg/papers/<name>.yaml``."""
    path = PAPERS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown paper {name!r}; papers: {', '.join(list_papers())}")
    raw = yaml.safe_load(path.read_text())
    metrics = tuple(raw["metrics"])
    tables = {tname: _table(path, tname, t, metrics) for tname, t in raw["tables"].items()}
    ids = [c.id for t in tables.values() for c in t.claims]
    if dupes := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConfigError(f"{path}: claim ids must be unique; repeated: {', '.join(dupes)}")
    budgets = {
        fed: _budget(b or {}, f"{path}: evidence_budget.{fed}")
        for fed, b in (raw.get("evidence_budget") or {}).items()
    }
    unit = raw.get("distance_unit", "px")
    if unit not in ("px", "mm"):
        raise ConfigError(f"{path}: distance_unit: expected px or mm, got {unit!r}")
    average = raw.get("average", "sites")
    if average not in AVERAGES:
        raise ConfigError(f"{path}: average: expected sites or cases, got {average!r}")
    paper_budget = raw.get("paper_budget", {})
    return Paper(name, raw["title"], metrics, paper_budget, tables, budgets, unit, average)
