"""Real ``flower-superlink`` and ``flower-supernode`` processes on 127.0.0.1.

Each test starts its own SuperLink and SuperNodes (its own ports and FLWR_HOME) and stops
exactly those processes by pid. Runs are 2 sites x 2-3 rounds on 32 px images.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from flower_helpers import SITES, assert_same_metrics, make_config
from typer.testing import CliRunner

from fedseg.engine.flower.cli import app as flower_cli
from fedseg.engine.flower.launcher import LocalFederation
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig
from fedseg.engine.flower.supernode import HEARTBEAT_ENV
from fedseg.engine.flower.tls import write_node_key
from fedseg.engine.runner import InProcessRunner

pytestmark = [pytest.mark.flower, pytest.mark.slow]

RUN_TIMEOUT = 900.0
"""Upper bound of one test's Flower run (a loaded 2-core machine is slow to start Python)."""


def _settings(run_dir: Path, **kw: object) -> FlowerSettings:
    return FlowerSettings(
        run_dir=run_dir, sites=tuple(SITES), round_timeout=600, join_timeout=600, **kw
    )  # type: ignore[arg-type]


def _all_stopped(fed: LocalFederation) -> None:
    assert fed.superlink is not None and not fed.superlink.alive()
    assert all(not p.alive() for p in fed._nodes)


def test_fedavg_via_fedseg_flower_local_equals_in_process_run(
    federation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`fedseg flower local CONFIG --split`: each SuperNode sees only its own data folder."""
    cfg = make_config(federation, "fedavg")
    ref = InProcessRunner(cfg, tmp_path / "ref").run()
    started: list[LocalFederation] = []
    init = LocalFederation.__init__

    def spy(self: LocalFederation, *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        started.append(self)

    monkeypatch.setattr(LocalFederation, "__init__", spy)
    config = tmp_path / "fedavg.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = tmp_path / "run"
    out = CliRunner().invoke(flower_cli, ["local", str(config), "--out", str(run), "--split"])
    assert out.exit_code == 0, out.output
    assert "DSC" in out.output  # the results table is printed
    _all_stopped(started[0])
    assert sorted(p.name for p in (run / "site-data").iterdir()) == SITES
    for s in SITES:  # one long-lived ClientApp process per site loaded everything once
        site_log = (run / "flower-logs" / f"site-{s}.log").read_text()
        assert site_log.count(f"site {s}: loading model, data and method") == 1
        assert site_log.count(f"site {s}: round ") == 2 and "flwr-clientapp" not in site_log
    res = json.loads((run / "results.json").read_text())
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    assert res["params"] == ref["params"]
    rounds = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["participants"] for r in rounds] == [SITES, SITES]
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)["server"]
    ck_ref = torch.load(tmp_path / "ref/checkpoints/last.pt", weights_only=True)["server"]
    ours = ck["payloads"][ck["payload_of"]["A"]]["tensors"]
    for k, v in ck_ref["payloads"][ck_ref["payload_of"]["A"]]["tensors"].items():
        assert torch.equal(ours[k], v), k  # separate processes, the same code: bit-identical


def test_fedbn_over_tls_with_supernode_auth(federation: Path, tmp_path: Path):
    """TLS + SuperNode authentication, run started with `fedseg flower server`: registered
    sites run FedBN exactly like in-process; a node registered as another site and a node
    with an unregistered key take no part."""
    cfg = make_config(federation, "fedbn")
    ref = InProcessRunner(cfg, tmp_path / "ref").run()
    config = tmp_path / "fedbn.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    sites = [SiteConfig(n, federation, tmp_path / "state" / n, threads=1) for n in SITES]
    with LocalFederation(sites, tmp_path / "work", tls=True, auth=True) as fed:
        assert fed.certs is not None
        impostor_key = fed.register_key("impostor", register_as="C")
        fed.start_node("impostor", SiteConfig("A", federation, tmp_path / "imp"), impostor_key)
        stranger_key, _ = write_node_key(tmp_path / "work/keys/stranger")
        fed.start_node("stranger", SiteConfig("B", federation, tmp_path / "str"), stranger_key)
        out = CliRunner().invoke(
            flower_cli,
            [
                "server", str(config), "--superlink", fed.address,
                "--root-certificates", str(fed.certs.ca), "--out", str(tmp_path / "run"),
                "--round-timeout", "600", "--join-timeout", "600",
            ],
        )  # fmt: skip
        assert out.exit_code == 0, out.output
    _all_stopped(fed)
    assert (tmp_path / "run/results.json").exists(), (
        out.output + (fed.log_dir / "superlink.log").read_text()
    )
    res = json.loads((tmp_path / "run/results.json").read_text())
    superlink_log = (fed.log_dir / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log  # the stranger
    assert "https://127.0.0.1" in superlink_log
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    log = (tmp_path / "run/run.log").read_text()
    assert "claims site 'A': it is registered as 'C'" in log
    assert log.count("joined as node") == 2
    assert (fed.workdir / "tls/server.pem").is_file()
    # FedBN's BN layers never left the sites: they are in the sites' own state files only
    for s in SITES:
        saved = sorted((tmp_path / "state" / s).glob("*/round-*.pt"))
        assert saved and "weights" in torch.load(saved[-1], weights_only=True)["method"]


def test_killed_site_is_recorded_and_rejoins(
    federation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Site B's SuperNode is killed (SIGKILL) during round 2 and restarted: its new node
    waits until the SuperLink marks the old one offline (missed heartbeats), round 2 finishes
    with A alone (B's failure recorded), B takes part again in round 3, nothing is lost.
    The SuperNodes announce a 10 s heartbeat (Flower's minimum), so the wait is ~20 s."""
    monkeypatch.setenv(HEARTBEAT_ENV, "10")
    cfg = make_config(federation, "fedbn", rounds=3)
    sites = [SiteConfig(n, federation, tmp_path / "state" / n, threads=1) for n in SITES]
    run_dir = tmp_path / "run"
    rounds_file = run_dir / "rounds.jsonl"
    with LocalFederation(sites, tmp_path / "work") as fed:
        killed = threading.Event()

        def crash_b_after_round_one() -> None:
            deadline = time.monotonic() + RUN_TIMEOUT
            while time.monotonic() < deadline:
                if rounds_file.exists() and rounds_file.read_text().count("\n") >= 1:
                    old = fed.supernodes["B"]
                    fed.kill_site("B", signal.SIGKILL)
                    assert not old.alive()
                    time.sleep(3)  # let the server send round 2 to the dead node first
                    fed.start_site("B")
                    killed.set()
                    return
                time.sleep(0.2)

        watcher = threading.Thread(target=crash_b_after_round_one, daemon=True)
        watcher.start()
        res = fed.run(cfg, _settings(run_dir, min_sites=1), timeout=RUN_TIMEOUT)
        watcher.join(timeout=5)
    _all_stopped(fed)
    assert killed.is_set()
    rounds = [json.loads(x) for x in rounds_file.read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[0]["participants"] == SITES
    assert rounds[1]["participants"] == ["A"] and "B" in rounds[1]["failures"]
    assert rounds[2]["participants"] == SITES
    assert res["participation"] == {"A": 3, "B": 2}
    assert set(res["sites"]) == set(SITES)
    assert torch.load(run_dir / "checkpoints/last.pt", weights_only=True)["round"] == 2
    assert "site 'B' joined again" in (run_dir / "run.log").read_text()
