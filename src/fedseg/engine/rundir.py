"""A run directory: resolved config, per-round JSONL, atomic checkpoints, results."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch
import yaml

from fedseg.config import from_run_dump
from fedseg.errors import ConfigError

__all__ = [
    "CASES_COLUMNS",
    "SAFE_RESUME_CHANGES",
    "RunDir",
    "atomic_write_bytes",
    "config_changes",
]

log = logging.getLogger(__name__)

CASES_COLUMNS = ("site", "case", "id", "region", "metric", "value")
"""Columns of ``cases.csv``: one row per (site, test case, region, metric)."""

SAFE_RESUME_CHANGES = (
    "name",
    "train.rounds",
    "eval.batch_size",
    "engine.device",
    "engine.threads",
    "engine.checkpoint_every",
    "engine.workers",
    "eval.save_models",
    "tracking.tensorboard",
    "tracking.mlflow",
)
"""Config keys a resumed run may change (``train.rounds`` only upwards): everything else
would continue one experiment with another's settings."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def atomic_write(
    path: Path, write: Callable[[BinaryIO], object], keep_old: Path | None = None
) -> None:
    """Stream ``write(file)`` into a temporary file beside ``path``, then move it to
    ``path``, so that a crash leaves either the old or the new file (``keep_old``: the old
    file is moved there first).

    The file gets the usual permissions (0666 minus the umask), not the private mode of a
    temporary file, so colleagues can read results as with any other file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        if keep_old is not None and path.exists():
            os.replace(path, keep_old)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda fh: fh.write(data))


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, key + ".")
        else:
            out[key] = v
    return out


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{dotted key: [old, new]}`` of every setting that differs between two configs."""
    a, b = _flatten(old), _flatten(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


AUXILIARY = frozenset({"run.log", "site-data", "sites", "flower-logs"})
"""What a launcher may put into a new run directory before the run starts (its log, the
sites' data copies, state folders and process logs)."""

_HELD: dict[Path, int] = {}
"""Run directories this process holds the lock of (path -> open lock file descriptor)."""


class RunDir:
    """Files of one run under ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.rounds_file = self.path / "rounds.jsonl"
        self.checkpoint = self.path / "checkpoints" / "last.pt"
        self.previous = self.path / "checkpoints" / "previous.pt"
        self.results_json = self.path / "results.json"
        self.results_md = self.path / "results.md"
        self.cases_csv = self.path / "cases.csv"
        self.resumes = self.path / "resumes.jsonl"
        self.log = self.path / "run.log"
        self.lock_file = self.path / ".lock"

    # -- ownership -----------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run directory for this process: a second process that tries to write the
        same run gets a clear error instead of mixing two runs. Re-entrant in a process."""
        key = self.path.resolve()
        if key in _HELD:
            yield
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"{self.path}: another fedseg process is writing this run directory; wait for "
                "it to finish or choose another --out"
            ) from None
        _HELD[key] = fd
        try:
            yield
        finally:
            del _HELD[key]
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def prepare_new(self, overwrite: bool = False) -> None:
        """Make sure a new run may start here: the folder is absent or empty, or it is an
        earlier fedseg run and ``overwrite`` is set (then its files are removed)."""
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise ConfigError(f"--out {self.path} exists and is not a folder")
        entries = [p for p in self.path.iterdir() if p.name != self.lock_file.name]
        if all(p.name in AUXILIARY for p in entries):  # set up by a launcher for this run
            return
        if not overwrite:
            raise ConfigError(
                f"--out {self.path} is not empty; pass --overwrite to replace the run there, "
                "--resume to continue it, or choose another folder"
            )
        if not self.config.exists():
            raise ConfigError(
                f"--out {self.path} is not empty and is no fedseg run directory (no "
                "config.yaml); refusing to delete it even with --overwrite"
            )
        for p in entries:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    def create(self, config_yaml: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.config, config_yaml.encode())
        atomic_write_bytes(self.rounds_file, b"")

    def stored_config(self) -> dict[str, Any]:
        """The run's ``config.yaml`` as a mapping."""
        try:
            raw = yaml.safe_load(self.config.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{self.config}: cannot read the run's config: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{self.config}: expected a mapping, got {type(raw).__name__}")
        return from_run_dump(raw)

    def record_resume(self, after_round: int, config_yaml: str, changes: dict[str, Any]) -> None:
        """Keep the resumed config as ``config.yaml`` and log what changed."""
        if not changes:
            return
        atomic_write_bytes(self.config, config_yaml.encode())
        with self.resumes.open("a") as fh:
            fh.write(json.dumps({"after_round": after_round, "changes": changes}) + "\n")

    # -- rounds --------------------------------------------------------------------------
    def append_round(self, record: dict[str, Any]) -> None:
        with self.rounds_file.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def rounds(self) -> list[dict[str, Any]]:
        """The round records; a damaged last line (a crash while appending) is skipped with
        a warning, a damaged line before it is an error naming the file and line."""
        if not self.rounds_file.exists():
            return []
        lines = self.rounds_file.read_text().splitlines()
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or not isinstance(rec.get("round"), int):
                    raise ValueError("not a round record")
            except ValueError as e:
                if i == len(lines) - 1:
                    log.warning("%s: ignoring a damaged last line (%s)", self.rounds_file, e)
                    continue
                raise ConfigError(
                    f"{self.rounds_file}:{i + 1}: damaged round record: {e}"
                ) from None
            out.append(rec)
        return out

    def keep_rounds_upto(self, last: int) -> None:
        """Drop JSONL records of rounds after ``last`` (written before a crash lost them)."""
        kept = [r for r in self.rounds() if r["round"] <= last]
        atomic_write_bytes(self.rounds_file, "".join(json.dumps(r) + "\n" for r in kept).encode())

    # -- checkpoints ---------------------------------------------------------------------
    def clean_temporary(self) -> None:
        """Remove temporary files left by a process killed while writing (``.name.*``)."""
        for folder in (self.path, self.checkpoint.parent):
            if folder.is_dir():
                for p in folder.glob(".*.*"):
                    if p.is_file() and p.name != self.lock_file.name:
                        p.unlink(missing_ok=True)

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``last.pt`` atomically; the one it replaces is kept as ``previous.pt``."""
        atomic_write(self.checkpoint, lambda fh: torch.save(state, fh), keep_old=self.previous)

    def load_checkpoint(self) -> dict[str, Any]:
        """The newest readable checkpoint, on the CPU (tensors and plain data only: no code
        runs). A damaged ``last.pt`` falls back to ``previous.pt`` with a warning."""
        if not self.checkpoint.exists() and not self.previous.exists():
            raise ConfigError(f"{self.path}: no checkpoint to resume from")
        errors = []
        for path in (self.checkpoint, self.previous):
            if not path.exists():
                continue
            try:
                ck = torch.load(path, map_location="cpu", weights_only=True)
                if not isinstance(ck, dict) or "round" not in ck:
                    raise ValueError("not a fedseg checkpoint")
            except Exception as e:  # any unreadable or unsafe file
                errors.append(f"{path.name}: {str(e).splitlines()[0][:200]}")
                continue
            if errors:
                log.warning("%s; resuming from %s", "; ".join(errors), path)
            return ck
        raise ConfigError(f"{self.path}: no usable checkpoint ({'; '.join(errors)})")

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
