"""Flower records for fedseg's messages: tensors in ArrayRecords, numbers in MetricRecords.

Every message holds a ``ConfigRecord`` envelope (:data:`META`: run id, round, site name,
example count, the federation spec as JSON) and, depending on its kind, the payload's
tensors (:data:`ARRAYS`), the payload's numbers (:data:`METRICS`), a client step's metrics
(:data:`TRAIN_METRICS`) or a site's evaluation (:data:`EVAL`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedseg.errors import UploadError
from fedseg.methods import FederationSpec, Payload, SiteSpec

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
    "spec_from_json",
    "spec_to_json",
]

ARRAYS = "arrays"
METRICS = "metrics"
TRAIN_METRICS = "train-metrics"
EVAL = "eval"
META = "fedseg"


def spec_to_json(spec: FederationSpec) -> str:
    """The federation spec as JSON (sites in their global order)."""
    return json.dumps(asdict(spec))


def spec_from_json(text: str) -> FederationSpec:
    """Inverse of :func:`spec_to_json`."""
    raw = json.loads(text)
    sites = tuple(SiteSpec(**s) for s in raw.pop("sites"))
    image_size = tuple(raw.pop("image_size", ()))
    return FederationSpec(**raw, sites=sites, image_size=image_size)


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


def eval_record(metrics: Mapping[str, Mapping[str, float]], cases: int) -> MetricRecord:
    """``{metric: {region: value}}`` and the case count as one flat MetricRecord."""
    flat: dict[str, Any] = {
        f"{m}/{r}": float(v) for m, per in metrics.items() for r, v in per.items()
    }
    flat["cases"] = int(cases)
    return MetricRecord(flat)


def read_eval(record: MetricRecord) -> dict[str, Any]:
    """Inverse of :func:`eval_record`: ``{"metrics": {metric: {region: value}}, "cases": n}``."""
    metrics: dict[str, dict[str, float]] = {}
    for key, value in record.items():
        if key == "cases":
            continue
        m, _, r = key.partition("/")
        metrics.setdefault(m, {})[r] = float(value)  # type: ignore[arg-type]
    return {"metrics": metrics, "cases": int(record["cases"])}  # type: ignore[arg-type]
