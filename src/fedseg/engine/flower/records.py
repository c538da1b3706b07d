"""Flower records for fedseg's messages: tensors in an ArrayRecord, numbers in MetricRecords.

Every message holds a ``ConfigRecord`` envelope (:data:`META`: run id, round, site name,
example count, the federation spec as JSON) and, depending on its kind, the payload's
tensors (:data:`ARRAYS`), the payload's numbers (:data:`METRICS`), a client step's metrics
(:data:`TRAIN_METRICS`) or a site's evaluation (:data:`EVAL`: per-region means, the case
count and every case's values keyed by its position, never its id).

A payload's tensors travel **packed** (:func:`pack`): their bytes one after another in one
``.npy`` byte array (:data:`PACKED`), their names, dtypes and shapes in the envelope
(:data:`LAYOUT`). Flower sends every array of a message as separate objects, each its own
request with its own checks, so one array instead of one per tensor (a UNet has ~60) cuts the
per-message cost of Flower's transport many times over. Packing copies each tensor once;
unpacking copies each once into a writable tensor.

A payload the server sends carries its digest (:data:`DIGEST`, SHA-256 of the packed bytes),
and its tensors only if the receiving site does not hold it yet (``held``): with periodic
evaluation, the model a site evaluates after round r is the one it trains in round r + 1, so
the training message names it by digest instead of moving it again. A site keeps the packed
payloads it received last (:class:`PayloadCache`) and answers a digest it does not hold with
a request to send the payload again (:data:`RESEND`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.constant import SType

from fedseg.engine.worker import EvalReply
from fedseg.errors import UploadError
from fedseg.methods import Payload

__all__ = [
    "ARRAYS",
    "DIGEST",
    "EVAL",
    "LAYOUT",
    "META",
    "METRICS",
    "PACKED",
    "RESEND",
    "TRAIN_METRICS",
    "Packed",
    "PayloadCache",
    "PayloadNotHeld",
    "content",
    "eval_record",
    "metric_record",
    "pack",
    "pack_with_digest",
    "read_eval",
    "read_meta",
    "read_metrics",
    "read_payload",
    "unpack",
]

ARRAYS = "arrays"
PACKED = "packed"
LAYOUT = "layout"
METRICS = "metrics"
TRAIN_METRICS = "train-metrics"
EVAL = "eval"
META = "fedseg"
DIGEST = "payload-digest"
RESEND = "resend-payload"


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """Numbers as a MetricRecord (ints stay ints, everything else becomes float)."""
    return MetricRecord(
        {
            k: v if isinstance(v, int) and not isinstance(v, bool) else float(v)
            for k, v in values.items()
        }
    )


_KINDS = "biuf"
"""NumPy dtype kinds a packed tensor may have: bool, signed and unsigned int, float."""


def pack(tensors: Mapping[str, torch.Tensor]) -> tuple[Array, str]:
    """``tensors`` as one ``.npy`` byte array (each tensor's bytes copied once) and its
    layout (JSON: ``[[name, dtype, shape], ...]`` in the order of the bytes)."""
    arrays = [(k, v.detach().cpu().contiguous().numpy()) for k, v in tensors.items()]
    size = sum(a.nbytes for _, a in arrays)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "|u1", "fortran_order": False, "shape": (size,)}
    )
    data = b"".join([head.getvalue(), *(a.reshape(-1).view(np.uint8).data for _, a in arrays)])
    layout = json.dumps([[k, str(a.dtype), list(a.shape)] for k, a in arrays])
    return Array(dtype="uint8", shape=(size,), stype=SType.NUMPY, data=data), layout


def unpack(array: Array, layout: str) -> dict[str, torch.Tensor]:
    """Inverse of :func:`pack`: writable tensors; ValueError naming what is malformed."""
    if array.stype != SType.NUMPY:
        raise ValueError(f"unsupported array serialisation {array.stype!r}")
    fp = io.BytesIO(array.data)
    np.lib.format.read_magic(fp)
    shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    if dtype != np.uint8 or len(shape) != 1:
        raise ValueError(f"packed tensors must be one uint8 vector, got {dtype} {shape}")
    entries = json.loads(layout)
    if not isinstance(entries, list):
        raise ValueError("layout must be a list of [name, dtype, shape]")
    out: dict[str, torch.Tensor] = {}
    start, used = fp.tell(), 0
    for entry in entries:
        name, kind, dims = entry if isinstance(entry, list) and len(entry) == 3 else (0, 0, 0)
        if not isinstance(name, str) or name in out or not isinstance(dims, list):
            raise ValueError(f"bad layout entry {entry!r}")
        dt = np.dtype(str(kind))
        if dt.kind not in _KINDS or not all(isinstance(d, int) and d >= 0 for d in dims):
            raise ValueError(f"bad layout entry {entry!r}")
        count = math.prod(dims)
        if start + used + count * dt.itemsize > len(array.data):
            raise ValueError(f"layout covers more than the {shape[0]} bytes sent")
        flat = np.frombuffer(array.data, dtype=dt, count=count, offset=start + used)
        out[name] = torch.from_numpy(flat.reshape(dims).copy())
        used += count * dt.itemsize
    if start + used != len(array.data) or used != shape[0]:
        raise ValueError(f"layout covers {used} bytes, {shape[0]} were sent")
    return out


Packed = tuple[Array, str, str]
"""A packed payload: the array, its layout and its digest ("" when not computed)."""


def pack_with_digest(tensors: Mapping[str, torch.Tensor], digest: bool = True) -> Packed:
    """:func:`pack` plus, with ``digest``, the SHA-256 of the packed bytes."""
    array, layout = pack(tensors)
    return array, layout, hashlib.sha256(array.data).hexdigest() if digest else ""


class PayloadNotHeld(UploadError):
    """A message names a payload by a digest the receiver does not hold."""


class PayloadCache:
    """The packed payloads a site received last (``capacity`` of them), by digest."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[Array, str]] = OrderedDict()

    def put(self, digest: str, array: Array, layout: str) -> None:
        self._items[digest] = (array, layout)
        self._items.move_to_end(digest)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, digest: str) -> tuple[Array, str] | None:
        return self._items.get(digest)


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
    *,
    held: str | None = None,
    packed: Packed | None = None,
) -> RecordDict:
    """A message body: the envelope plus whatever the message carries. With ``held`` (the
    digest of the payload the receiver holds, "" for none) the payload carries its digest
    and its tensors only if it is not the one held. ``packed`` is the payload already packed
    with its digest ("" when ``held`` is None; :func:`pack_with_digest`), so that one payload
    sent to several sites is packed and hashed once."""
    records: dict[str, Any] = {META: ConfigRecord(dict(meta))}
    if payload is not None:
        array, layout, digest = packed or pack_with_digest(payload.tensors, held is not None)
        if held is None or digest != held:
            records[ARRAYS] = ArrayRecord({PACKED: array})
            records[META][LAYOUT] = layout
        if held is not None:
            records[META][DIGEST] = digest
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


def read_payload(body: RecordDict, cache: PayloadCache | None = None) -> Payload:
    """The payload of a message; UploadError naming what is malformed. With a ``cache``, a
    payload sent with its digest is kept there, and one named only by its digest is taken
    from there (PayloadNotHeld if it is not)."""
    arrays, metrics, meta = body.get(ARRAYS), body.get(METRICS), read_meta(body)
    digest = meta.get(DIGEST)
    if arrays is None and cache is not None and isinstance(digest, str):
        held = cache.get(digest)
        if held is None:
            raise PayloadNotHeld(f"the payload {digest[:12]} is not held here")
        arrays, layout = ArrayRecord({PACKED: held[0]}), held[1]
    else:
        layout = str(meta.get(LAYOUT, ""))
    if not isinstance(arrays, ArrayRecord):
        raise UploadError(f"message has no {ARRAYS!r} ArrayRecord (records: {sorted(body)})")
    if list(arrays) != [PACKED]:
        raise UploadError(f"the {ARRAYS!r} record must hold only {PACKED!r}, got {list(arrays)}")
    try:
        tensors = unpack(arrays[PACKED], layout)
    except Exception as e:  # malformed arrays from a remote party
        raise UploadError(f"cannot read the {ARRAYS!r} record: {e}") from None
    n = meta.get("num-examples", 0)
    if not isinstance(n, int) or isinstance(n, bool):
        raise UploadError(f"num-examples must be an int, got {n!r}")
    if cache is not None and isinstance(digest, str) and ARRAYS in body:
        cache.put(digest, arrays[PACKED], layout)
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
