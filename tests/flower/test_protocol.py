"""The Flower engine's server and site logic, driven in-process through a direct link."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flower_helpers import assert_same_metrics, direct_link, make_config

from fedseg.engine.flower.link import run_federation
from fedseg.engine.flower.records import (
    ARRAYS,
    DIGEST,
    PayloadCache,
    content,
    pack_with_digest,
    read_meta,
    read_payload,
)
from fedseg.engine.flower.site import LOADED
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError, FedsegError
from fedseg.methods import Payload

pytestmark = pytest.mark.flower


@pytest.mark.parametrize("method", ["fedavg", "fedbn"])
def test_direct_federation_equals_in_process_run(federation: Path, tmp_path: Path, method: str):
    cfg = make_config(federation, method)
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, federation, tmp_path / "flower")
    res = run_federation(cfg, st, link)
    assert list(res["sites"]) == ["A", "B"]
    assert_same_metrics(res["sites"], ref["sites"], 0.0)  # the same code: bit-identical
    assert res["params"] == ref["params"]
    assert res["communication"] == ref["communication"]
    run, inproc = tmp_path / "flower", tmp_path / "inproc"
    files = {str(p.relative_to(inproc)) for p in inproc.rglob("*") if p.is_file()}
    assert files >= {"config.yaml", "rounds.jsonl", "results.json", "checkpoints/last.pt"}
    assert all((run / f).is_file() for f in files)  # every file of an in-process run
    assert (run / "config.yaml").read_text() == (tmp_path / "inproc" / "config.yaml").read_text()
    ours = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]
    theirs = [json.loads(x) for x in (tmp_path / "inproc/rounds.jsonl").read_text().splitlines()]
    assert [r["participants"] for r in ours] == [["A", "B"]] * 2
    assert all(r["failures"] == {} for r in ours)
    for a, b in zip(ours, theirs, strict=True):
        assert a["clients"] == b["clients"] and a["comm"] == b["comm"]
    ck_ours = torch.load(run / "checkpoints/last.pt", weights_only=True)
    ck_ref = torch.load(tmp_path / "inproc/checkpoints/last.pt", weights_only=True)
    for s in ("A", "B"):
        ours_p = ck_ours["server"]["payloads"][ck_ours["server"]["payload_of"][s]]["tensors"]
        ref_p = ck_ref["server"]["payloads"][ck_ref["server"]["payload_of"][s]]["tensors"]
        for k, v in ref_p.items():
            assert torch.equal(ours_p[k], v), k
    # private state stayed on the sites' disks, one file per kept round
    assert ck_ours["sites"] == {}
    for s in ("A", "B"):
        saved = sorted((run / "sites" / s).glob("*/round-*.pt"))
        assert [p.name for p in saved] == ["round-00000.pt", "round-00001.pt"]
        state = torch.load(saved[-1], weights_only=True)["method"]
        ref_state = ck_ref["sites"][s][1]["method"]
        for k, v in ref_state.get("weights", {}).items():
            assert torch.equal(state["weights"][k], v), k


def test_a_site_that_lost_the_payload_named_by_digest_gets_it_again(
    federation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Round 2's training message names the model the site evaluated after round 1 by its
    digest; a site process that restarted in between does not hold it, asks for it, gets it
    in full, and the run equals the in-process one."""
    cfg = make_config(federation, "fedavg")
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    link, st = direct_link(cfg, federation, tmp_path / "flower")
    call, named = link._call, []

    def restart_b(kind: str, site: str, body):  # type: ignore[no-untyped-def]
        if kind == "train" and ARRAYS not in body:
            named.append(site)
            if site == "B":
                monkeypatch.setattr(LOADED, "payloads", PayloadCache())
        return call(kind, site, body)

    link._call = restart_b  # type: ignore[method-assign]
    res = run_federation(cfg, st, link)
    assert named == ["A", "B"]  # round 2 (periodic evaluation after round 1)
    assert [link.sent.count(("train", s)) for s in ("A", "B")] == [2, 3]
    assert_same_metrics(res["sites"], ref["sites"], 0.0)
    assert res["params"] == ref["params"]
    rounds = [json.loads(x) for x in (tmp_path / "flower/rounds.jsonl").read_text().splitlines()]
    assert all(r["failures"] == {} for r in rounds)


def test_without_reuse_every_message_carries_its_payload(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg")
    link, st = direct_link(cfg, federation, tmp_path, reuse_payloads=False)
    call, bodies = link._call, []

    def record(kind: str, site: str, body):  # type: ignore[no-untyped-def]
        bodies.append((kind, body))
        return call(kind, site, body)

    link._call = record  # type: ignore[method-assign]
    run_federation(cfg, st, link)
    sent = [b for kind, b in bodies if kind in ("train", "evaluate")]
    assert len(sent) == 8 and all(ARRAYS in b for b in sent)  # 2 sites x (2 train + 2 eval)


def test_site_failure_is_recorded_and_the_site_rejoins(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedbn", rounds=3)
    link, st = direct_link(cfg, federation, tmp_path, min_sites=1)
    link.down_in_round = {1: {"B"}}
    res = run_federation(cfg, st, link)
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["participants"] for r in rounds] == [["A", "B"], ["A"], ["A", "B"]]
    assert set(rounds[1]["failures"]) == {"B"}
    assert res["participation"] == {"A": 3, "B": 2}
    assert set(res["sites"]) == {"A", "B"}


def test_too_few_replies_stop_the_run_and_resume_continues(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg", rounds=2)
    link, st = direct_link(cfg, federation, tmp_path, min_sites=2, retries=1)
    link.down_in_round = {1: {"B"}}
    with pytest.raises(FedsegError, match="fewer than 2 valid uploads in 2 attempts"):
        run_federation(cfg, st, link)
    assert [
        json.loads(x)["round"] for x in (tmp_path / "rounds.jsonl").read_text().splitlines()
    ] == [0]
    sent = [k for k in link.sent if k[0] == "train"]
    assert sent.count(("train", "A")) == 3  # round 1 once, round 2 twice (retried)

    # the site is back: resume from the checkpoint after round 1
    link2, st2 = direct_link(cfg, federation, tmp_path, min_sites=2, resume=True)
    res = run_federation(cfg, st2, link2)
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1]
    assert [r["participants"] for r in rounds] == [["A", "B"], ["A", "B"]]
    ref = InProcessRunner(cfg, tmp_path / "inproc").run()
    for s in ("A", "B"):
        assert res["sites"][s]["dsc"] == pytest.approx(ref["sites"][s]["dsc"], abs=1e-5)


def _corrupt(kind: str):
    def fix(body):
        meta, payload = read_meta(body), read_payload(body)
        sd, n = dict(payload.tensors), payload.num_examples
        key = next(iter(sd))
        if kind == "nan":
            sd[key] = sd[key].clone().fill_(float("nan"))
        elif kind == "shape":
            sd[key] = torch.zeros(3, 3)
        elif kind == "dtype":
            sd[key] = sd[key].double()
        elif kind == "examples":  # claims a billion samples to take over the average
            n = 10**9
        else:
            sd["evil.extra"] = torch.zeros(1)
        return content(meta, payload=Payload(sd, payload.metrics, n))

    return fix


def _global(run: Path) -> dict[str, torch.Tensor]:
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)["server"]
    return ck["payloads"][ck["payload_of"]["A"]]["tensors"]


@pytest.mark.parametrize("kind", ["nan", "shape", "dtype", "unknown_key", "examples"])
def test_malformed_upload_is_rejected_and_leaves_the_model_untouched(
    federation: Path, tmp_path: Path, kind: str
):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path / "run", min_sites=1)
    link.tamper["B"] = _corrupt(kind)
    run_federation(cfg, st, link)
    record = json.loads((tmp_path / "run" / "rounds.jsonl").read_text().splitlines()[0])
    assert record["participants"] == ["A"]
    assert record["failures"]["B"].startswith("rejected upload")
    # the global model is A's upload alone (FedAvg over one site), never the corrupt one
    alone_link, alone_st = direct_link(cfg, federation, tmp_path / "alone", min_sites=1)
    alone_link.down_in_round = {0: {"B"}}
    run_federation(cfg, alone_st, alone_link)
    ours, alone = _global(tmp_path / "run"), _global(tmp_path / "alone")
    for k, v in alone.items():
        assert torch.equal(ours[k], v), k


def test_all_uploads_malformed_keeps_the_initial_model(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path, min_sites=1, retries=0)
    link.tamper = {"A": _corrupt("nan"), "B": _corrupt("shape")}
    with pytest.raises(FedsegError, match="valid uploads"):
        run_federation(cfg, st, link)
    assert not (tmp_path / "checkpoints" / "last.pt").exists()  # nothing was aggregated
    assert (tmp_path / "rounds.jsonl").read_text() == ""


def test_reply_for_another_round_or_site_is_rejected(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path, min_sites=1)

    def wrong_round(body):
        from flwr.app import ConfigRecord

        meta = read_meta(body)
        body["fedseg"] = ConfigRecord({**meta, "round": 7})
        return body

    link.tamper["B"] = wrong_round
    run_federation(cfg, st, link)
    record = json.loads((tmp_path / "rounds.jsonl").read_text().splitlines()[0])
    assert "round" in record["failures"]["B"] and record["participants"] == ["A"]


def _bad_eval(kind: str):
    def fix(body):
        from flwr.app import MetricRecord

        rec = dict(body["eval"])
        if kind == "dsc_7":
            rec[next(k for k in rec if k.startswith("dsc/"))] = 7.0
        elif kind == "negative_hd95":
            rec[next(k for k in rec if k.startswith("hd95/"))] = -1.0
        elif kind == "no_cases":
            rec["cases"] = 0
        else:
            rec["garbage"] = 1.0
        body["eval"] = MetricRecord(rec)
        return body

    return fix


@pytest.mark.parametrize("kind", ["dsc_7", "negative_hd95", "no_cases", "garbage"])
def test_implausible_evaluation_is_that_sites_failure(federation: Path, tmp_path: Path, kind):
    cfg = make_config(federation, "fedavg", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path)
    link.tamper_eval["B"] = _bad_eval(kind)
    res = run_federation(cfg, st, link)
    assert list(res["sites"]) == ["A"]
    assert res["missing_sites"]["B"].startswith("invalid evaluation")
    assert res["average"] == res["sites"]["A"]


def test_sites_must_be_declared_and_agree(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg").model_copy(
        update={"data": make_config(federation).data.model_copy(update={"sites": None})}
    )
    link, st = direct_link(cfg, federation, tmp_path)
    with pytest.raises(ConfigError, match="sites declared"):
        run_federation(cfg, st, link)


def test_pooled_method_is_refused(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "centralized")
    link, st = direct_link(cfg, federation, tmp_path)
    with pytest.raises(ConfigError, match="pooled"):
        run_federation(cfg, st, link)


def test_missing_site_times_out_with_a_clear_error(federation: Path, tmp_path: Path):
    cfg = make_config(federation, "fedavg")
    link, st = direct_link(cfg, federation, tmp_path)
    link.down = {"B"}
    with pytest.raises(FedsegError, match=r"only 1 of the sites \['A', 'B'\] are connected"):
        run_federation(cfg, st, link)


def test_each_site_learns_only_its_own_entry_of_the_federation(federation: Path, tmp_path: Path):
    from fedseg.engine.server import spec_from_json

    cfg = make_config(federation, "fedlppa", rounds=1)
    link, st = direct_link(cfg, federation, tmp_path)
    seen: dict[str, list] = {}
    call = link._call

    def spy(kind, site, body):
        if kind != "hello":
            seen[site] = list(spec_from_json(read_meta(body)["spec"]).sites)
        return call(kind, site, body)

    link._call = spy  # type: ignore[method-assign]
    run_federation(cfg, st, link)
    a, b = seen["A"], seen["B"]
    assert a[0].name == "A" and a[0].num_train > 0 and a[0].annotation != "unknown"
    assert (a[1].name, a[1].num_train, a[1].annotation, a[1].sparsity) == ("#1", 0, "unknown", None)
    assert b[0].name == "#0" and b[1].name == "B"


def test_a_payload_shared_by_the_sites_is_packed_once_per_message_round(
    federation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """FedAvg sends one global model to both sites: it is packed and hashed once per train
    or evaluate exchange, not once per site, and each site's body carries the same digest."""
    import fedseg.engine.flower.link as link_module

    cfg = make_config(federation, "fedavg")
    link, st = direct_link(cfg, federation, tmp_path)
    packs = []

    def counted(tensors, digest=True):  # type: ignore[no-untyped-def]
        packs.append(digest)
        return pack_with_digest(tensors, digest)

    monkeypatch.setattr(link_module, "pack_with_digest", counted)
    call, digests = link._call, []

    def record(kind: str, site: str, body):  # type: ignore[no-untyped-def]
        if kind in ("train", "evaluate"):
            digests.append((kind, site, read_meta(body).get(DIGEST)))
        return call(kind, site, body)

    link._call = record  # type: ignore[method-assign]
    run_federation(cfg, st, link)
    assert len(packs) == 4 and all(packs)  # 2 rounds x (train + evaluate), not x 2 sites
    assert len(digests) == 8
    for i in range(0, len(digests), 2):
        (_, a, da), (_, b, db) = digests[i], digests[i + 1]
        assert (a, b) == ("A", "B") and da == db and len(da) == 64
