"""SecAgg+ over fedseg's Flower apps: the ServerApp's GridLink and the real ClientApp (with
Flower's secaggplus_mod and SecAggPlusWorkflow) exchange real Flower messages through an
in-process Grid that records what the server receives."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from flwr.app import Context, Error, Message, RecordDict
from flwr.common import bytes_to_ndarray
from flwr.common.constant import ErrorCode
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from fedseg.config import parse_config
from fedseg.data.synth import synthesize
from fedseg.engine.flower.client_app import build_client_app
from fedseg.engine.flower.link import run_federation
from fedseg.engine.flower.server_app import GridLink
from fedseg.engine.flower.settings import FlowerSettings, run_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError
from fedseg.privacy.central import NoisySum

SITES = ["A", "B", "C"]
CLIP = 0.5


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fed") / "fundus"
    synthesize("fundus", root, sites=3, size=32, per_site=6, seed=0)
    return root


def _cfg(root: Path, rounds: int, secure: bool) -> Any:
    privacy: dict[str, Any] = {"mode": "central", "clip": CLIP, "noise_multiplier": 0.5}
    if secure:
        privacy["secure_aggregation"] = {"neighbours": 1.0, "threshold": 0.5}
    return parse_config(
        {
            "seed": 5,
            "data": {"root": str(root), "labels": "full", "sites": SITES},
            "model": {"name": "unet", "widths": [4, 8, 16], "dropout": [0, 0, 0]},
            "train": {"rounds": rounds, "local_iters": 1, "batch_size": 4, "augment": False},
            "eval": {"every": 0, "batch_size": 8},
            "engine": {"device": "cpu"},
            "privacy": privacy,
        }
    )


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages take their run and task ids from the process (set by Flower in a ServerApp)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


@dataclass
class _Node:
    node_id: int


class LocalGrid:
    """A Flower Grid whose nodes are fedseg's ClientApp in this process, one Context per
    node (the mod keeps its protocol state there). It records every reply the server
    receives; ``drop`` names (round, site, stage) whose message gets no reply."""

    def __init__(self, root: Path, rc: dict[str, Any], state: Path) -> None:
        self.app = build_client_app(lambda c: (c.node_config, c.run_config))
        self.site = {100 + i: s for i, s in enumerate(SITES)}
        self.ctx = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config={"site-name": s, "data-dir": str(root), "state-dir": str(state / s)},
                state=RecordDict(),
                run_config=rc,
            )
            for nid, s in self.site.items()
        }
        self.replies: dict[str, Message] = {}
        self.received: list[Message] = []
        self.drop: set[tuple[str, str, str]] = set()

    def get_nodes(self) -> list[_Node]:
        return [_Node(n) for n in self.ctx]

    def _answer(self, msg: Message) -> Message | None:
        msg = copy.deepcopy(msg)  # a node gets its own copy, as if deserialised
        nid = msg.metadata.dst_node_id
        records = msg.content.config_records
        stage = str(records[RECORD_KEY_CONFIGS]["stage"]) if RECORD_KEY_CONFIGS in records else ""
        if (msg.metadata.group_id, self.site[nid], stage) in self.drop:
            return None
        try:
            return self.app(msg, self.ctx[nid])
        except Exception as e:  # a raising ClientApp is an error reply in Flower too
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, str(e)), reply_to=msg)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = mid = uuid.uuid4().hex
            reply = self._answer(msg)
            if reply is not None:
                self.replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        got = [self.replies.pop(m) for m in list(message_ids) if m in self.replies]
        self.received += got
        return got

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        return self.pull_messages(self.push_messages(messages))


def _run(root: Path, out: Path, rounds: int, drop=()) -> tuple[dict[str, Any], LocalGrid]:
    cfg = _cfg(root, rounds, secure=True)
    st = FlowerSettings(run_dir=out, poll_interval=0.01, join_timeout=1.0, round_timeout=5.0)
    grid = LocalGrid(root, run_config(cfg, st), out / "sites")
    grid.drop = set(drop)
    return run_federation(cfg, st, GridLink(grid, 0.01)), grid  # type: ignore[arg-type]


def _global(run: Path) -> dict[str, torch.Tensor]:
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)
    return ck["server"]["payloads"][0]["tensors"]


def test_secagg_sum_equals_the_plain_dp_aggregate_and_the_server_sees_no_update(
    federation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ref = InProcessRunner(_cfg(federation, 1, secure=False), tmp_path / "plain").run()

    def no_single_uploads(*_: Any) -> None:
        raise AssertionError("the server code path was handed an individual upload")

    monkeypatch.setattr(NoisySum, "add", no_single_uploads)
    res, grid = _run(federation, tmp_path / "secure", rounds=1)
    plain, secure = _global(tmp_path / "plain"), _global(tmp_path / "secure")
    # quantisation: 2 * clip / 2**22 per site and value, three sites summed with weight 1/3
    step = 2 * CLIP / 2**22
    for k, v in plain.items():
        assert torch.allclose(secure[k].double(), v.double(), rtol=1e-6, atol=3 * step), k
    assert any(not torch.equal(secure[k], v) for k, v in plain.items() if v.is_floating_point())
    assert res["privacy"]["epsilon"] == ref["privacy"]["epsilon"]
    # what reached the server: no arrays in any training reply, only masked integer vectors
    train = [m for m in grid.received if m.metadata.message_type == "train"]
    assert len(train) == 4 * 3  # four protocol stages, three sites
    for m in train:
        assert all(len(rec) == 0 for rec in m.content.array_records.values())
    masked = [
        m.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        for m in train
        if Key.MASKED_PARAMETERS in m.content.config_records[RECORD_KEY_CONFIGS]
    ]
    assert len(masked) == 3
    for vector in masked:  # quantised updates lie in [0, 2**22]; masked ones fill [0, 2**32)
        values = np.concatenate([bytes_to_ndarray(b).ravel() for b in vector[1:]])
        assert values.size > 5000 and (values > 2**22).mean() > 0.99
    record = json.loads((tmp_path / "secure/rounds.jsonl").read_text().splitlines()[0])
    assert record["participants"] == SITES and record["clients"] == {}
    sizes = [sum(len(b) for b in vector) for vector in masked]
    assert sorted(v["bytes"] for v in record["comm"]["upload"].values()) == sorted(sizes)


def test_a_site_dropping_out_mid_round_does_not_stop_the_run(federation: Path, tmp_path: Path):
    drop = {("2", "B", Stage.COLLECT_MASKED_VECTORS)}  # B trains no masked vector in round 2
    res, _ = _run(federation, tmp_path / "run", rounds=3, drop=drop)
    rounds = [json.loads(x) for x in (tmp_path / "run/rounds.jsonl").read_text().splitlines()]
    assert [r["participants"] for r in rounds] == [SITES, ["A", "C"], SITES]
    assert "B" in rounds[1]["failures"] and not rounds[2]["failures"]
    assert res["privacy"]["rounds"] == 3 and set(res["sites"]) == set(SITES)


def test_secure_aggregation_is_refused_in_process(federation: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="secure_aggregation runs only over Flower"):
        InProcessRunner(_cfg(federation, 1, secure=True), tmp_path / "run").run()
    with pytest.raises(ConfigError, match="secure_aggregation needs mode: central"):
        parse_config({"data": {"root": "x"}, "privacy": {"secure_aggregation": {}}})


@pytest.mark.flower
@pytest.mark.slow
def test_secagg_over_real_flower_processes(federation: Path, tmp_path: Path):
    """`fedseg flower local`: a SuperLink and three SuperNodes on loopback run SecAgg+."""
    from typer.testing import CliRunner

    from fedseg.engine.flower.cli import app as flower_cli

    cfg = _cfg(federation, 2, secure=True)
    config = tmp_path / "secure.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = tmp_path / "run"
    out = CliRunner().invoke(flower_cli, ["local", str(config), "--out", str(run)])
    assert out.exit_code == 0, out.output
    rounds = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["participants"] for r in rounds] == [SITES, SITES]
    assert all(r["clients"] == {} and set(r["comm"]["upload"]) == set(SITES) for r in rounds)
    res = json.loads((run / "results.json").read_text())
    assert res["privacy"]["rounds"] == 2 and set(res["sites"]) == set(SITES)
