"""Live experiment tracking: every round record to TensorBoard and/or MLflow.

The round loop calls a listener after each round with the record it appends to
``rounds.jsonl``. :func:`round_scalars` flattens a record into named scalars (per-site client
metrics such as the loss and LA weight statistics, server numbers such as the AAW weights per
site, the periodic evaluation's DSC per site and region, time and bytes) and
:func:`round_matrices` picks out its matrices (the prompt affinity, the auxiliary mixing
weights), labelled by site. The backends are switched on by the config's ``tracking:``
block (docs/config.md#tracking); MLflow is an optional dependency imported only when asked for.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedseg.errors import ConfigError

if TYPE_CHECKING:
    from fedseg.config import TrackingSettings

__all__ = [
    "MLflowTracker",
    "RoundListener",
    "TensorBoardTracker",
    "Tracker",
    "round_listener",
    "round_matrices",
    "round_scalars",
]

RoundListener = Callable[[dict[str, Any]], None]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _matrix(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(isinstance(row, list) and row and all(_number(x) for x in row) for row in v)
    )


def round_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """Named scalars of one round record: ``client/<metric>/<site>``, ``server/<key>`` (and
    ``server/<key>/<site>`` for per-site mappings such as ``aaw_weights``), the entries of
    every matrix (``server/<key>/<row>/<col>``), ``eval_dsc/<site>/<region>``, ``time/*``,
    ``comm/<direction>_bytes`` and ``sites/*`` counts."""
    out: dict[str, float] = {}
    for site, metrics in record.get("clients", {}).items():
        for key, v in metrics.items():
            if _number(v):
                out[f"client/{key}/{site}"] = float(v)
    server = record.get("server") or {}
    for key, v in server.items():
        if _number(v):
            out[f"server/{key}"] = float(v)
        elif isinstance(v, Mapping):
            out |= {f"server/{key}/{k}": float(x) for k, x in v.items() if _number(x)}
    for key, (mat, rows, cols) in round_matrices(record).items():
        for i, row in enumerate(mat):
            for j, x in enumerate(row):
                out[f"server/{key}/{rows[i]}/{cols[j]}"] = float(x)
    for site, regions in (record.get("eval") or {}).items():
        out |= {f"eval_dsc/{site}/{r}": float(x) for r, x in regions.items() if _number(x)}
    for key in ("seconds", "cpu_seconds"):
        if _number(record.get(key)):
            out[f"time/{key}"] = float(record[key])
    for direction, per_site in (record.get("comm") or {}).items():
        out[f"comm/{direction}_bytes"] = float(sum(s["bytes"] for s in per_site.values()))
    out["sites/participants"] = float(len(record.get("participants", [])))
    out["sites/failures"] = float(len(record.get("failures") or {}))
    return out


def round_matrices(
    record: Mapping[str, Any],
) -> dict[str, tuple[list[list[float]], list[str], list[str]]]:
    """The server's matrices of one round, ``key -> (matrix, row labels, column labels)``;
    labels are the sites (``<key>_sites``, else ``affinity_sites``) when their number fits,
    else indices."""
    server = record.get("server") or {}
    out = {}
    for key, v in server.items():
        if not _matrix(v):
            continue
        names = server.get(f"{key}_sites") or server.get("affinity_sites") or []

        def labels(n: int, names: list[Any] = names) -> list[str]:
            return [str(s) for s in names] if len(names) == n else [str(i) for i in range(n)]

        out[key] = (v, labels(len(v)), labels(len(v[0])))
    return out


class Tracker(Protocol):
    """A tracking backend: one call per round, closed when the run ends."""

    def log_round(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files in ``<run dir>/tensorboard``: the round scalars, and each matrix as a
    grey-scale image scaled to its value range (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "tracking.tensorboard: the tensorboard package is not installed "
                "(pip install 'fedseg[tensorboard]' or pip install tensorboard)"
            ) from None
        self.log_dir, self._writer_type = log_dir, SummaryWriter
        self._writer: Any = None  # opened at the first round: the run directory is set up

    @property
    def writer(self) -> Any:
        if self._writer is None:
            self._writer = self._writer_type(log_dir=str(self.log_dir))
        return self._writer

    def log_round(self, record: Mapping[str, Any]) -> None:
        import torch

        step = int(record["round"]) + 1
        for tag, value in round_scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        for key, (mat, _, _) in round_matrices(record).items():
            m = torch.tensor(mat, dtype=torch.float32)
            span = float(m.max() - m.min())
            image = (m - m.min()) / span if span > 0 else torch.zeros_like(m)
            self.writer.add_image(f"server/{key}", image, step, dataformats="HW")
        self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class MLflowTracker:
    """The round scalars as MLflow metrics (step = round) in a run named after the run
    directory; its ``config.yaml`` and ``results.json`` as artifacts at the end.
    ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME`` choose the server and experiment
    (MLflow's defaults: ``./mlruns``)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            import mlflow
        except ImportError:
            raise ConfigError(
                "tracking.mlflow: the mlflow package is not installed "
                "(pip install 'fedseg[mlflow]' or pip install mlflow)"
            ) from None
        self.mlflow, self.run_dir, self.active = mlflow, run_dir, False

    def log_round(self, record: Mapping[str, Any]) -> None:
        if not self.active:
            self.mlflow.start_run(run_name=self.run_dir.name)
            self.active = True
        self.mlflow.log_metrics(round_scalars(record), step=int(record["round"]) + 1)

    def close(self) -> None:
        if not self.active:
            return
        for name in ("config.yaml", "results.json"):
            if (self.run_dir / name).is_file():
                self.mlflow.log_artifact(str(self.run_dir / name))
        self.mlflow.end_run()


@contextlib.contextmanager
def round_listener(
    settings: TrackingSettings, run_dir: Path, then: RoundListener | None = None
) -> Iterator[RoundListener | None]:
    """The listener the round loop calls after each round: the enabled trackers of
    ``settings`` (the config's ``tracking`` block), then ``then``; the trackers are closed
    when the block ends. Yields ``then`` unchanged when no tracker is enabled."""
    trackers: list[Tracker] = []
    try:
        if settings.tensorboard:
            trackers.append(TensorBoardTracker(Path(run_dir) / "tensorboard"))
        if settings.mlflow:
            trackers.append(MLflowTracker(Path(run_dir)))
        if not trackers:
            yield then
            return

        def listen(record: dict[str, Any]) -> None:
            for t in trackers:
                t.log_round(record)
            if then is not None:
                then(record)

        yield listen
    finally:
        for t in trackers:
            t.close()
