"""Communication counted by the engine equals what the Flower link actually serialises (a
training payload the site received with the evaluation before it travels there once)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from flower_helpers import DirectLink, direct_link, make_config
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto

from fedseg.engine.flower.link import run_federation
from fedseg.engine.flower.records import ARRAYS, DIGEST, LAYOUT, METRICS, read_meta

pytestmark = pytest.mark.flower


def _wire(body: RecordDict) -> tuple[int, int, int, int]:
    """(tensor data bytes, tensors, payload numbers, whole serialised message bytes)."""
    data, tensors = 0, 0
    arrays = body.get(ARRAYS)
    if isinstance(arrays, ArrayRecord):
        for arr in arrays.values():  # one packed array: the tensors' bytes
            data += np.load(io.BytesIO(arr.data), allow_pickle=False).nbytes
        tensors = len(json.loads(read_meta(body)[LAYOUT]))
    metrics = body.get(METRICS)
    numbers = len(metrics) if isinstance(metrics, MetricRecord) else 0
    return data, tensors, numbers, len(recorddict_to_proto(body).SerializeToString())


class MeasuringLink(DirectLink):
    """Records what every training message and reply puts on the wire; a training payload
    sent by digest is measured in the evaluation message that brought it."""

    def __init__(self, inner: DirectLink) -> None:
        super().__init__(inner.sites, inner.rc)
        self.wire: dict[tuple[int, str, str], tuple[int, int, int, int]] = {}
        self.evaluated: dict[str, RecordDict] = {}
        self.by_digest = 0

    def _call(self, kind, site, body):  # type: ignore[no-untyped-def]
        reply = super()._call(kind, site, body)
        if kind == "evaluate":
            self.evaluated[site] = body
        if kind == "train":
            r, carrier = int(read_meta(body)["round"]), body
            if ARRAYS not in body:
                carrier = self.evaluated[site]
                assert read_meta(carrier)[DIGEST] == read_meta(body)[DIGEST]
                self.by_digest += 1
            data, tensors, numbers, _ = _wire(carrier)
            self.wire[(r, site, "download")] = (data, tensors, numbers, _wire(body)[3])
            if not isinstance(reply, str):
                self.wire[(r, site, "upload")] = _wire(reply)
        return reply


@pytest.mark.parametrize("method", ["fedlc", "fedap"])
def test_counted_bytes_equal_the_serialised_tensors(federation: Path, tmp_path: Path, method):
    """FedLC sends every site's head to each site, FedAP uploads BN statistics: tensors that
    are not the model's shared weights, all counted."""
    cfg = make_config(federation, method)
    if method == "fedap":  # statistics travel from the first round on
        cfg = cfg.model_copy(update={"method": {"name": method, "warmup_rounds": 0}})
    inner, st = direct_link(cfg, federation, tmp_path)
    link = MeasuringLink(inner)
    run_federation(cfg, st, link)
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    for rec in rounds:
        for way in ("upload", "download"):
            for site, counted in rec["comm"][way].items():
                data, tensors, numbers, whole = link.wire[(rec["round"], site, way)]
                assert counted["bytes"] == data + 8 * numbers
                if (rec["round"], way) == (1, "download"):  # sent with the evaluation
                    assert whole < 4096
                    continue
                # framing (the layout, the npy header, the envelope) is the only difference
                assert data < whole <= data + 300 * tensors + 4096
    assert link.by_digest == 2  # round 2's payloads came with round 1's evaluation
    up, down = rounds[0]["comm"]["upload"]["A"], rounds[0]["comm"]["download"]["A"]
    if method == "fedlc":  # every site's head comes down on top of the shared weights
        assert down["values"] - up["values"] == 2 * (16 * 3 * 9 + 3)
    else:  # the BN statistics go up on top of the shared weights
        assert up["values"] - down["values"] == 2944  # mean and var of 1,472 BN channels
