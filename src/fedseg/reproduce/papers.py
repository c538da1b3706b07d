"""The papers' tables: which shipped config each row runs and the numbers the paper published.

One YAML file per paper in ``fedseg/papers/`` (package data). A table names its published
``columns``; each row has a ``label``, the shipped ``config`` it runs (or the table's
``base``), ``set`` overrides (``key.sub=value``, applied after the table's own ``set``) and
the ``published`` values in column order (``null`` where the paper gives none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fedseg.errors import ConfigError

__all__ = ["PAPERS_DIR", "Paper", "PaperRow", "PaperTable", "list_papers", "load_paper"]

PAPERS_DIR = Path(__file__).resolve().parent.parent / "papers"
"""Where the papers' tables live (``fedseg/papers/<paper>.yaml``)."""


@dataclass(frozen=True)
class PaperRow:
    """One row of a paper table: what to run and what the paper reports for it."""

    label: str
    config: str
    overrides: tuple[str, ...] = ()
    published: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class PaperTable:
    """A table of a paper: its published columns and its rows."""

    name: str
    title: str
    source: str
    """Where the published numbers are (file:lines under the project's shared/papers)."""
    columns: tuple[str, ...]
    rows: tuple[PaperRow, ...]


@dataclass(frozen=True)
class Paper:
    """A paper's tables, the metrics we report beside them and its paper-scale budget."""

    name: str
    title: str
    metrics: tuple[str, ...]
    paper_budget: dict[str, Any]
    tables: dict[str, PaperTable] = field(default_factory=dict)

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


@cache
def load_paper(name: str) -> Paper:
    """Read and check ``fedseg/papers/<name>.yaml``."""
    path = PAPERS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown paper {name!r}; papers: {', '.join(list_papers())}")
    raw = yaml.safe_load(path.read_text())
    tables = {}
    for tname, t in raw["tables"].items():
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
        tables[tname] = PaperTable(tname, t["title"], t["source"], columns, tuple(rows))
    return Paper(name, raw["title"], tuple(raw["metrics"]), raw.get("paper_budget", {}), tables)
