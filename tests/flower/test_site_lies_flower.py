"""A site that lies over Flower: forged hellos, site-name takeover, poisoned uploads and
declared sample counts, on the scripted Grid (:class:`FakeGrid`) and the direct link."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from flower_helpers import (
    Node,
    direct_link,
    grid_link,
    hello_of,
    make_config,
    set_task_identity,
)

from fedseg.engine.flower import server_app
from fedseg.engine.flower.link import run_federation
from fedseg.engine.flower.records import content, read_meta, read_payload
from fedseg.engine.server import build_spec
from fedseg.errors import ConfigError, FedsegError, UploadError
from fedseg.methods import Payload

pytestmark = pytest.mark.flower

FORGED = [
    ("num-train", "many"),
    ("num-train", -3),
    ("num-train", 0),
    ("num-train", 2.5),
    ("num-train", float("nan")),
    ("num-train", 10**12),
    ("num-train", True),
    ("channels", "1"),
    ("num-classes", 10**9),
    ("ndim", 4),
    ("image-size", [32]),
    ("image-size", [32, -1]),
    ("annotation", "evil"),
    ("site", ""),
]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    set_task_identity(monkeypatch)


# -- forged hellos ---------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "value"), FORGED)
def test_a_forged_hello_refuses_that_node_only(field: str, value: Any, caplog):
    link, _ = grid_link(Node(1, "A"), Node(2, "B", hello={field: value}))
    with caplog.at_level(logging.WARNING):
        assert link.announce("run").keys() == {"A"}
    assert link.banned == {2}
    assert f"hello field {field!r}" in caplog.text


def test_a_hello_without_a_field_is_refused():
    link, grid = grid_link(Node(1, "A"), Node(2, "B"))
    grid.nodes[2].hello = {"ndim": None}
    assert link.announce("run").keys() == {"A"}


@pytest.mark.parametrize(("field", "value"), FORGED[:6])
def test_build_spec_names_the_site_and_field(field: str, value: Any):
    infos = {"A": hello_of("A"), "B": {**hello_of("B"), field: value}}
    with pytest.raises(UploadError, match=rf"site 'B': hello field '{field}'"):
        build_spec("full", ["A", "B"], infos)


def test_a_forged_hello_over_the_direct_link_is_a_clear_refusal(
    federation: Path, tmp_path: Path, caplog
):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path / "run")
    honest = link.announce
    link.announce = lambda uid: {  # type: ignore[method-assign]
        s: {**i, "num-train": "many"} if s == "B" else i for s, i in honest(uid).items()
    }
    with caplog.at_level(logging.WARNING), pytest.raises(FedsegError, match="only 1 of the sites"):
        run_federation(cfg, st, link)
    assert "site 'B': hello field 'num-train'" in caplog.text


# -- takeover --------------------------------------------------------------------------------
def test_a_second_node_for_a_live_site_is_refused():
    link, grid = grid_link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[9] = Node(9, "A")  # claims A while A's node is online
    assert link.announce("run").keys() == {"A", "B"}
    assert link.site_node == {"A": 1, "B": 2} and link.standby == {9: "A"}
    replies = link.exchange("train", {"A": content({"x": 1})}, timeout=5)
    assert read_meta(replies["A"])["x"] == 1  # type: ignore[arg-type]
    assert link.site_node["A"] == 1


def test_with_auth_the_site_stays_bound_to_its_registered_key(monkeypatch):
    monkeypatch.setattr(server_app, "LIVENESS_CHECK", 0.0)
    link, grid = grid_link(Node(1, "A", name="A", public_key=b"key-A"), Node(2, "B", name="B"))
    link.announce("run")
    assert link.keys == {"A": b"key-A"}
    grid.nodes[1].online = False  # A disconnects
    assert link.announce("run").keys() == {"B"}
    # another key registered under the name A claims the free site: refused, online or not
    grid.nodes[9] = Node(9, "A", name="A", public_key=b"key-X")
    assert link.announce("run").keys() == {"B"} and 9 in link.banned
    # A reconnects: Flower gives its key the same node id; it serves its site again
    grid.nodes[1].online = True
    assert link.announce("run").keys() == {"A", "B"} and link.site_node["A"] == 1
    assert 1 not in link.gone


def test_without_auth_a_free_site_goes_to_the_next_node_that_describes_it_alike():
    link, grid = grid_link(Node(1, "A"), Node(2, "B"))
    link.announce("run")
    grid.nodes[1].online = False
    grid.nodes[8] = Node(8, "A", hello={"num-train": 11})  # another description: refused
    grid.nodes[9] = Node(9, "A")
    assert link.announce("run").keys() == {"A", "B"}
    assert link.site_node["A"] == 9 and 8 in link.banned


# -- poisoned uploads and declared sample counts, over the direct link -----------------------
def _poison(kind: str):
    def fix(body):
        meta, payload = read_meta(body), read_payload(body)
        sd = dict(payload.tensors)
        for k, t in sd.items():
            if kind == "scale" and t.is_floating_point():
                sd[k] = t * 1e6
            elif kind == "negative_var" and k.endswith("running_var"):
                sd[k] = -t.abs() - 1e-3
        return content(meta, payload=Payload(sd, payload.metrics, payload.num_examples))

    return fix


def _first_round(run: Path) -> dict[str, Any]:
    return json.loads((run / "rounds.jsonl").read_text().splitlines()[0])


def test_a_scaled_upload_is_refused_with_the_norm_bound_on(federation: Path, tmp_path: Path):
    screening = {"max_update_norm_ratio": 10}
    for name, extra in (("off", {}), ("on", {"screening": screening})):
        cfg = make_config(federation, "fedavg", rounds=1, **extra)
        link, st = direct_link(cfg, federation, tmp_path / name, min_sites=1)
        link.tamper["B"] = _poison("scale")
        run_federation(cfg, st, link)
    assert _first_round(tmp_path / "off")["participants"] == ["A", "B"]  # finite: accepted
    on = _first_round(tmp_path / "on")
    assert on["participants"] == ["A"]
    assert "screening.max_update_norm_ratio" in on["failures"]["B"]


def test_a_negative_running_var_is_refused(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path, min_sites=1)
    link.tamper["B"] = _poison("negative_var")
    run_federation(cfg, st, link)
    record = _first_round(tmp_path)
    assert record["participants"] == ["A"]
    assert "running_var has negative values" in record["failures"]["B"]


def test_an_inflated_sample_count_is_refused_with_the_bound_on(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg", rounds=1, screening={"max_samples_ratio": 10})
    link, st = direct_link(cfg, federation, tmp_path)
    honest = link.announce
    link.announce = lambda uid: {  # type: ignore[method-assign]
        s: {**i, "num-train": 10**9} if s == "B" else i for s, i in honest(uid).items()
    }
    with pytest.raises(ConfigError, match=r"site 'B' declares 1000000000 .*max_samples_ratio"):
        run_federation(cfg, st, link)
