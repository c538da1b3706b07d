"""A run directory: resolved config, per-round JSONL, atomic checkpoints, results."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["CASES_COLUMNS", "RunDir", "atomic_write_bytes"]

CASES_COLUMNS = ("site", "case", "id", "region", "metric", "value")
"""Columns of ``cases.csv``: one row per (site, test case, region, metric)."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDir:
    """Files of one run under ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.rounds_file = self.path / "rounds.jsonl"
        self.checkpoint = self.path / "checkpoints" / "last.pt"
        self.results_json = self.path / "results.json"
        self.results_md = self.path / "results.md"
        self.cases_csv = self.path / "cases.csv"
        self.log = self.path / "run.log"

    def create(self, config_yaml: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.config, config_yaml.encode())
        self.rounds_file.write_text("")

    def append_round(self, record: dict[str, Any]) -> None:
        with self.rounds_file.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def rounds(self) -> list[dict[str, Any]]:
        if not self.rounds_file.exists():
            return []
        return [json.loads(line) for line in self.rounds_file.read_text().splitlines() if line]

    def keep_rounds_upto(self, last: int) -> None:
        """Drop JSONL records of rounds after ``last`` (written before a crash lost them)."""
        kept = [r for r in self.rounds() if r["round"] <= last]
        atomic_write_bytes(self.rounds_file, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(self.checkpoint, buf.getvalue())

    def load_checkpoint(self) -> dict[str, Any]:
        """The last checkpoint, on the CPU (tensors and plain data only: no code runs)."""
        from fedseg.errors import ConfigError

        if not self.checkpoint.exists():
            raise ConfigError(f"{self.path}: no checkpoint to resume from")
        return torch.load(self.checkpoint, map_location="cpu", weights_only=True)

    def write_results(self, results: dict[str, Any]) -> None:
        atomic_write_bytes(self.results_json, (json.dumps(results, indent=2) + "\n").encode())

    def write_markdown(self, markdown: str) -> None:
        atomic_write_bytes(self.results_md, markdown.encode())

    def write_cases(self, per_site: Mapping[str, Any]) -> None:
        """``cases.csv`` from each site's per-case records (see :data:`CASES_COLUMNS`)."""
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(CASES_COLUMNS)
        for site, ev in per_site.items():
            for i, case in enumerate(ev.per_case):
                for metric, regions in case["metrics"].items():
                    for region, value in regions.items():
                        out.writerow([site, i, case.get("id") or "", region, metric, repr(value)])
        atomic_write_bytes(self.cases_csv, buf.getvalue().encode())
