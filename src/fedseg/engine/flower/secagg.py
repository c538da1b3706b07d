"""Secure aggregation of DP updates with Flower's own SecAgg+ (``privacy.secure_aggregation``).

Flower's SecAgg+ (``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on a site) speaks
the legacy FitIns/FitRes layout through a legacy ``Strategy``; fedseg's messages are mapped
onto it, with nothing of the protocol re-implemented:

* server: :func:`secure_sum` runs one workflow round over the Grid. :class:`_Shim`, a
  stand-in Strategy, hands each sampled node its fedseg training body inside a FitIns (the
  payload's arrays in key order, the envelope and the site's fixed DP weight in the config)
  and receives, in ``aggregate_fit``, only the unmasked mean of the replies: the server code
  never holds one site's update.
* site: :func:`secure_train` turns the FitIns back into a fedseg training body, runs the
  ordinary handler (the method's client step; under central DP the upload is the clipped
  update), and answers a FitRes of the update's float tensors times the site's weight, with
  weight 1 and no metrics. The mod then quantises it, masks it and sends only the masked
  vector.

The mean over the ``n`` sites that sent a masked vector, times ``n``, is the fixed-weight sum
of their clipped updates, which the DP server step noises
(:class:`~fedseg.privacy.central.NoisySum`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    bytes_to_ndarray,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedseg.engine.flower.records import content, read_meta, read_payload
from fedseg.errors import UploadError
from fedseg.methods import Payload
from fedseg.privacy.settings import PrivacySettings

__all__ = ["SecureSum", "is_secure", "secure_sum", "secure_train"]

log = logging.getLogger(__name__)

BODY, KEYS, WEIGHT = "fedseg-meta", "fedseg-keys", "fedseg-weight"
"""FitIns config keys: the training envelope (JSON), the payload's keys (JSON), the weight."""


def is_secure(msg: Message) -> bool:
    """Whether ``msg`` is a stage of the SecAgg+ protocol (not a plain fedseg message)."""
    return RECORD_KEY_CONFIGS in msg.content.config_records


# -- site -----------------------------------------------------------------------------------
def secure_train(
    msg: Message,
    context: Context,
    handler: Callable[[RecordDict, Mapping[str, Any], Mapping[str, Any]], RecordDict],
    configs: tuple[Mapping[str, Any], Mapping[str, Any]],
) -> Message:
    """Answer a SecAgg+ stage: ``handler`` (the fedseg training handler, called with the
    node and run ``configs``) runs at the stage that carries the FitIns; the mod masks what
    it returns."""

    def fit(inner: Message, _: Context) -> Message:
        ins = compat.recorddict_to_fitins(inner.content, keep_input=True)
        keys = json.loads(str(ins.config[KEYS]))
        arrays = parameters_to_ndarrays(ins.parameters)
        tensors = {k: torch.from_numpy(a.copy()) for k, a in zip(keys, arrays, strict=True)}
        meta = json.loads(str(ins.config[BODY]))
        reply = handler(content(meta, payload=Payload(tensors)), *configs)
        upload = read_payload(reply)
        w = float(ins.config[WEIGHT])
        if not 0 < w <= 1:
            raise UploadError(f"secure aggregation: a site's weight must be in (0, 1], got {w}")
        floats = [
            (t.double() * w).numpy()
            for _, t in sorted(upload.tensors.items())
            if t.is_floating_point()
        ]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(floats), 1, {})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=inner)

    return secaggplus_mod(msg, context, fit)


# -- server ---------------------------------------------------------------------------------
@dataclass
class SecureSum:
    """One secure round: the weighted sum of the summed sites' updates (float tensors by
    key; ``None`` when the protocol halted) and the sites it covers."""

    total: dict[str, torch.Tensor] | None
    sites: list[str]
    upload: dict[str, dict[str, int]]
    """Per site, the masked vector it sent: ``values`` and ``bytes``."""


class _Metered:
    """The Grid as the workflow uses it, counting each node's masked vector on the way."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.upload: dict[int, dict[str, int]] = {}

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        for msg in replies:
            records = {} if msg.has_error() else msg.content.config_records
            masked = records.get(RECORD_KEY_CONFIGS, {}).get(Key.MASKED_PARAMETERS)
            if masked:
                vectors = [bytes_to_ndarray(b) for b in masked]  # type: ignore[arg-type]
                self.upload[msg.metadata.src_node_id] = {
                    "values": sum(v.size for v in vectors),
                    "bytes": sum(len(b) for b in masked),  # type: ignore[arg-type,misc]
                }
        return replies


@dataclass
class _Node:
    node_id: int


class _Shim(Strategy):
    """The legacy Strategy SecAgg+ needs: configure_fit hands out the prepared FitIns,
    aggregate_fit keeps the unmasked mean and who it covers."""

    def __init__(self, fitins: Mapping[int, FitIns]) -> None:
        self.fitins = dict(fitins)
        self.mean: list[np.ndarray] | None = None
        self.nodes: list[int] = []

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> Any:
        return [(_Node(nid), ins) for nid, ins in self.fitins.items()]

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        self.nodes = [proxy.node_id for proxy, _ in results]
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: Any
    ) -> list[Any]:
        return []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


def _fitins(body: RecordDict, weight: float) -> FitIns:
    """A fedseg training body as FitIns: the payload's arrays in key order, the envelope,
    the payload's keys and the site's DP weight in the config."""
    payload = read_payload(body)
    keys = list(payload.tensors)
    arrays = [payload.tensors[k].numpy() for k in keys]
    config = {BODY: json.dumps(read_meta(body)), KEYS: json.dumps(keys), WEIGHT: weight}
    return FitIns(ndarrays_to_parameters(arrays), config)


def secure_sum(
    grid: Grid,
    bodies: Mapping[str, RecordDict],
    nodes: Mapping[str, int],
    weights: Mapping[str, float],
    keys: list[str],
    r: int,
    settings: PrivacySettings,
    timeout: float,
) -> SecureSum:
    """One SecAgg+ round of the sites in ``bodies`` (reached at ``nodes``): the sum of their
    weighted updates for the float tensors ``keys`` (sorted), never one site's update."""
    site_of = {nid: s for s, nid in nodes.items()}
    shim = _Shim({nodes[s]: _fitins(b, weights[s]) for s, b in bodies.items() if s in nodes})
    ctx = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    ctx.state.config_records["config"] = ConfigRecord({"current_round": r + 1})
    ctx.state.array_records["parameters"] = ArrayRecord()
    sec = settings.secure_aggregation
    workflow = SecAggPlusWorkflow(
        num_shares=sec.neighbours,
        reconstruction_threshold=sec.threshold,
        max_weight=1.0,
        clipping_range=settings.clip,
        timeout=timeout,
    )
    metered = _Metered(grid)
    workflow(metered, LegacyContext(ctx, strategy=shim))  # type: ignore[arg-type]
    upload = {site_of[nid]: size for nid, size in metered.upload.items() if nid in site_of}
    if shim.mean is None:
        return SecureSum(None, [], upload)
    if len(shim.mean) != len(keys):
        raise UploadError(f"secure aggregate has {len(shim.mean)} arrays, expected {len(keys)}")
    n = len(shim.nodes)
    total = {
        k: torch.from_numpy(np.asarray(a, dtype=np.float64) * n)
        for k, a in zip(keys, shim.mean, strict=True)
    }
    return SecureSum(total, [site_of[nid] for nid in shim.nodes], upload)
