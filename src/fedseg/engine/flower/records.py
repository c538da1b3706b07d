"""Flower records for fedseg's messages: tensors in ArrayRecords, numbers in MetricRecords.

Every message holds a ``ConfigRecord`` envelope (:data:`META`: run id, round, site name,
example count, the federation spec as JSON) and, depending on its kind, the payload's
tensors (:data:`ARRAYS`), the payload's numbers (:data:`METRICS`), a client step's metrics
(:data:`TRAIN_METRICS`) or a site's evaluation (:data:`EVAL`: per-region means, the case
count and every case's values keyed by its position, never its id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedseg.engine.worker import EvalReply
from fedseg.errors import UploadError
from fedseg.methods import Payload

__all__ = [
    "ARRAYS",
    "EVAL",
    "META",
    "METRICS",
    "TRAIN_METRICS",
    "content",
    "eval_record",
    "metric_record",
    "read_eval",
    "read_meta",
    "read_metrics",
    "read_payload",
]

ARRAYS = "arrays"
METRICS = "metrics"
TRAIN_METRICS = "train-metrics"
EVAL = "eval"
META = "fedseg"


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """Numbers as a MetricRecord (ints stay ints, everything else becomes float)."""
    return MetricRecord(
        {
            k: v if isinstance(v, int) and not isinstance(v, bool) else float(v)
            for k, v in values.items()
        }
    )


def read_metrics(record: MetricRecord | None) -> dict[str, float]:
    """A MetricRecord of scalars as ``{name: float}`` (lists are dropped)."""
    if record is None:
        return {}
    return {k: float(v) for k, v in record.items() if isinstance(v, int | float)}


def content(
    meta: Mapping[str, Any],
    payload: Payload | None = None,
    train_metrics: Mapping[str, float] | None = None,
    evaluation: MetricRecord | None = None,
) -> RecordDict:
    """A message body: the envelope plus whatever the message carries."""
    records: dict[str, Any] = {META: ConfigRecord(dict(meta))}
    if payload is not None:
        records[ARRAYS] = ArrayRecord(
            {k: v.detach().cpu().contiguous() for k, v in payload.tensors.items()}
        )
        records[METRICS] = metric_record(payload.metrics)
        records[META]["num-examples"] = int(payload.num_examples)
    if train_metrics is not None:
        records[TRAIN_METRICS] = metric_record(train_metrics)
    if evaluation is not None:
        records[EVAL] = evaluation
    return RecordDict(records)


def read_meta(body: RecordDict) -> dict[str, Any]:
    """The envelope of a message; UploadError when it has none."""
    rec = body.get(META)
    if not isinstance(rec, ConfigRecord):
        raise UploadError(f"message has no {META!r} ConfigRecord (records: {sorted(body)})")
    return dict(rec)


def read_payload(body: RecordDict) -> Payload:
    """The payload of a message; UploadError naming what is malformed."""
    arrays, metrics = body.get(ARRAYS), body.get(METRICS)
    if not isinstance(arrays, ArrayRecord):
        raise UploadError(f"message has no {ARRAYS!r} ArrayRecord (records: {sorted(body)})")
    try:
        tensors = {k: v.clone() for k, v in arrays.to_torch_state_dict().items()}
    except Exception as e:  # malformed arrays from a remote party
        raise UploadError(f"cannot read the {ARRAYS!r} record: {e}") from None
    n = read_meta(body).get("num-examples", 0)
    if not isinstance(n, int) or isinstance(n, bool):
        raise UploadError(f"num-examples must be an int, got {n!r}")
    return Payload(tensors, read_metrics(metrics if isinstance(metrics, MetricRecord) else None), n)


def eval_record(
    metrics: Mapping[str, Mapping[str, float]],
    cases: int,
    per_case: Sequence[Mapping[str, Any]] = (),
) -> MetricRecord:
    """``{metric: {region: value}}``, the case count and each case's values
    (``case/<i>/<metric>/<region>``) as one flat MetricRecord."""
    flat: dict[str, Any] = {
        f"{m}/{r}": float(v) for m, per in metrics.items() for r, v in per.items()
    }
    for i, case in enumerate(per_case):
        for m, per in case["metrics"].items():
            for r, v in per.items():
                flat[f"case/{i}/{m}/{r}"] = float(v)
    flat["cases"] = int(cases)
    return MetricRecord(flat)


def read_eval(record: MetricRecord) -> EvalReply:
    """Inverse of :func:`eval_record` (per-case ids are not sent: cases are numbered)."""
    metrics: dict[str, dict[str, float]] = {}
    cases: dict[int, dict[str, dict[str, float]]] = {}
    for key, value in record.items():
        if key == "cases":
            continue
        if not isinstance(value, int | float) or "/" not in key:
            raise UploadError(f"unexpected evaluation entry {key!r}: {value!r}")
        if key.startswith("case/"):
            _, i, m, r = [*key.split("/", 3), "", ""][:4]
            if not i.isdigit() or not r:
                raise UploadError(f"unexpected evaluation entry {key!r}")
            cases.setdefault(int(i), {}).setdefault(m, {})[r] = float(value)
        else:
            m, _, r = key.partition("/")
            metrics.setdefault(m, {})[r] = float(value)
    per_case = [{"index": i, "id": None, "metrics": cases[i]} for i in sorted(cases)]
    n = record["cases"]
    if not isinstance(n, int) or isinstance(n, bool):
        raise UploadError(f"evaluation 'cases' must be an int, got {n!r}")
    return EvalReply(metrics, n, per_case)
