"""Adaptive aggregation weights: the update rule by hand, its timing, and real runs."""

import json
import math

import pytest
import torch

from fedseg.engine.simulation import Simulation
from fedseg.errors import ConfigError, UploadError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.aaw import GLOBAL_LOSS, LOCAL_LOSS, step_size, update_weights
from fedseg.reporting.weights_plot import load_weight_history, plot_weights
from fedseg.testing import toy_federation


def approx(d: dict[str, float]) -> dict[str, object]:
    return {k: pytest.approx(v, abs=1e-12) for k, v in d.items()}


# -- the update rule, worked by hand ------------------------------------------------------
def test_update_hand_worked_example():
    # max|G| = 0.4; a + 0.1 G / 0.4 = (0.55, 0.2, 0.225), sum 0.975
    new = update_weights({"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 0.2, "b": -0.4, "c": 0.1}, 0.1)
    assert new == approx({"a": 0.55 / 0.975, "b": 0.2 / 0.975, "c": 0.225 / 0.975})


def test_update_clips_above_one_and_renormalises():
    # a: 0.7 + 0.5 * 0.5 / 0.5 = 1.2 -> 1.0; b: 0.3 - 0.5 * 0.25 / 0.5 = 0.05; sum 1.05
    new = update_weights({"a": 0.7, "b": 0.3}, {"a": 0.5, "b": -0.25}, 0.5)
    assert new == approx({"a": 1.0 / 1.05, "b": 0.05 / 1.05})


def test_update_clips_below_zero():
    # c: 0.05 - 0.1 = -0.05 -> 0; a: 0.6 + 0.05; b unchanged; sum 1.0
    new = update_weights({"a": 0.6, "b": 0.35, "c": 0.05}, {"a": 0.1, "b": 0.0, "c": -0.2}, 0.1)
    assert new == approx({"a": 0.65, "b": 0.35, "c": 0.0})


def test_zero_gap_round_leaves_weights_unchanged():
    weights = {"a": 0.25, "b": 0.75}
    assert update_weights(weights, {"a": 0.0, "b": 0.0}, 0.1) == weights
    assert update_weights(weights, {}, 0.1) == weights


def test_centered_gaps_follow_feddg_ga():
    # mean gap -1/30; centred (7/30, -11/30, 4/30), max 11/30
    g = {"a": 0.2, "b": -0.4, "c": 0.1}
    new = update_weights({"a": 0.5, "b": 0.3, "c": 0.2}, g, 0.1, center=True)
    raw = {"a": 0.5 + 0.1 * 7 / 11, "b": 0.3 - 0.1, "c": 0.2 + 0.1 * 4 / 11}
    total = sum(raw.values())
    assert new == approx({k: v / total for k, v in raw.items()})
    # equal gaps carry no information once centred
    same = {"a": 0.3, "b": 0.3, "c": 0.3}
    assert update_weights({"a": 0.5, "b": 0.3, "c": 0.2}, same, 0.1, center=True) == {
        "a": 0.5,
        "b": 0.3,
        "c": 0.2,
    }


def test_step_size_decays_linearly():
    assert step_size(0, 10) == pytest.approx(0.1)
    assert step_size(5, 10) == pytest.approx(0.05)
    assert step_size(9, 10, base=0.2) == pytest.approx(0.02)


# -- the server step: timing and the outlier ------------------------------------------------
def _method(**cfg):
    spec, _ = toy_federation(3, labels="full", with_val=True)
    cls = get_method("fedavg_aaw")
    return cls(cls.Config(**cfg), spec), spec


def _uploads(spec, values, losses):
    return {
        s.name: Payload(
            {"w": torch.tensor([v])},
            {GLOBAL_LOSS: q, LOCAL_LOSS: p},
            num_examples=s.num_train,
        )
        for s, v, (q, p) in zip(spec.sites, values, losses, strict=True)
    }


def _ctx(spec, r, rounds=10):
    return ServerContext(spec, r, TrainSettings(rounds=rounds), torch.Generator())


def test_first_aggregation_uses_sample_weights_and_timing_pairs_p_with_next_q():
    method, spec = _method()
    n = {s.name: s.num_train for s in spec.sites}  # 8, 10, 12
    state = method.init_server(torch.nn.Linear(1, 1)).state
    a0 = {s: k / sum(n.values()) for s, k in n.items()}
    assert state["aaw"]["weights"] == approx(a0)
    # round 0: Q is of the initial model and is ignored; P is remembered
    out0 = method.server_step(
        _uploads(spec, [1.0, 2.0, 3.0], [(9.0, 0.5), (9.0, 0.5), (9.0, 2.0)]), state, _ctx(spec, 0)
    )
    expected = sum(a0[s.name] * v for s, v in zip(spec.sites, [1.0, 2.0, 3.0], strict=True))
    assert float(out0.payloads["site0"].tensors["w"]) == pytest.approx(expected)
    assert out0.metrics["aaw_weights"] == approx(a0) and out0.metrics["aaw_gaps"] == {}
    # round 1: the aggregate of round 0 scores Q = (0.9, 0.6, 1.0) -> G = (0.4, 0.1, -1.0)
    out1 = method.server_step(
        _uploads(spec, [0.0, 0.0, 6.0], [(0.9, 0.3), (0.6, 0.3), (1.0, 0.3)]),
        out0.state,
        _ctx(spec, 1),
    )
    s = step_size(0, 10)
    raw = {"site0": a0["site0"] + s * 0.4, "site1": a0["site1"] + s * 0.1, "site2": a0["site2"] - s}
    a1 = {k: v / sum(raw.values()) for k, v in raw.items()}
    assert out1.metrics["aaw_gaps"] == approx({"site0": 0.4, "site1": 0.1, "site2": -1.0})
    assert out1.metrics["aaw_weights"] == approx(a1)
    assert float(out1.payloads["site1"].tensors["w"]) == pytest.approx(6.0 * a1["site2"])
    # the outlier (local model far worse than the aggregate on its own data) lost weight
    assert a1["site2"] < a0["site2"] and a1["site0"] > a0["site0"]
    assert out1.state["aaw"]["local_loss"] == {"site0": 0.3, "site1": 0.3, "site2": 0.3}


def test_absent_site_keeps_weight_and_aggregation_renormalises():
    method, spec = _method(initial="uniform")
    state = method.init_server(torch.nn.Linear(1, 1)).state
    ups = _uploads(spec, [1.0, 2.0, 3.0], [(1.0, 1.0)] * 3)
    state = method.server_step(ups, state, _ctx(spec, 0)).state
    only = {k: ups[k] for k in ("site0", "site1")}
    only["site0"].metrics[GLOBAL_LOSS] = 2.0  # gap +1 for site0, 0 for site1
    out = method.server_step(only, state, _ctx(spec, 1))
    assert set(out.metrics["aaw_gaps"]) == {"site0", "site1"}
    w = out.metrics["aaw_weights"]
    assert w["site0"] > w["site1"] == pytest.approx(w["site2"])
    want = (w["site0"] * 1.0 + w["site1"] * 2.0) / (w["site0"] + w["site1"])
    assert float(out.payloads["site2"].tensors["w"]) == pytest.approx(want)
    assert math.isclose(sum(w.values()), 1.0)


def test_upload_without_losses_is_rejected():
    method, spec = _method()
    state = method.init_server(torch.nn.Linear(1, 1)).state
    ups = _uploads(spec, [1.0, 2.0, 3.0], [(1.0, 1.0)] * 3)
    del ups["site1"].metrics[LOCAL_LOSS]
    with pytest.raises(UploadError, match=r"site1.*val_loss_local"):
        method.server_step(ups, state, _ctx(spec, 0))


def test_config_validation():
    cls = get_method("fedavg_aaw")
    with pytest.raises(ValueError, match="step"):
        cls.Config(step=0)
    assert get_method("fedprox_aaw").Config(mu=0.1, center_gaps=True).mu == 0.1


# -- real runs -----------------------------------------------------------------------------
def test_site_without_validation_split_is_a_config_error():
    spec, sites = toy_federation(2, labels="full", with_val=True)
    sites["site0"].val = None
    cls = get_method("fedavg_aaw")
    sim = Simulation(cls(cls.Config(), spec), sites, TrainSettings(rounds=1, augment=False))
    with pytest.raises(ConfigError, match="site 'site0' has no validation split"):
        sim.round(0)


def test_outlier_site_loses_weight_in_a_real_run():
    """site2 trains on inverted masks: its local model is worse on its own (clean) validation
    data than the aggregate (G < 0), while the other sites' local models beat the aggregate
    (G > 0), so site2's weight falls below its sample share n_i / n round after round."""
    spec, sites = toy_federation(3, labels="full", with_val=True, size=32, seed=1)
    sites["site2"].train_labels = 1 - sites["site2"].train_labels
    cls = get_method("fedavg_aaw")
    train = TrainSettings(
        rounds=3, local_iters=3, batch_size=4, lr=1e-3, augment=False, loss="dice_bce"
    )
    sim = Simulation(cls(cls.Config(), spec), sites, train, seed=0)
    records = [sim.round(r) for r in range(train.rounds)]
    weights = [r["server"]["aaw_weights"]["site2"] for r in records]
    assert weights[0] == pytest.approx(12 / 30)
    assert weights[2] < weights[1] < weights[0]
    gaps = records[1]["server"]["aaw_gaps"]
    assert gaps["site2"] < 0 < min(gaps["site0"], gaps["site1"])
    client = records[0]["clients"]["site2"]
    assert client[LOCAL_LOSS] > 0 and client[GLOBAL_LOSS] > 0
    assert sum(records[-1]["server"]["aaw_weights"].values()) == pytest.approx(1.0)


def test_3d_two_sites_two_rounds_on_cpu():
    spec, sites = toy_federation(2, ndim=3, size=16, labels="full", with_val=True, n_train=4)
    cls = get_method("fedavg_aaw")
    train = TrainSettings(rounds=2, local_iters=2, batch_size=2, augment=True, loss="dice_bce")
    sim = Simulation(cls(cls.Config(), spec), sites, train, seed=0)
    records = [sim.round(r) for r in range(2)]
    assert records[1]["server"]["aaw_gaps"].keys() == {"site0", "site1"}
    assert records[1]["server"]["aaw_weights"] != records[0]["server"]["aaw_weights"]
    res = sim.evaluate({"fg": [1]}, batch_size=2)
    assert set(res) == {"site0", "site1"}
    assert all(0.0 <= r["metrics"]["dsc"]["fg"] <= 1.0 for r in res.values())


def test_fedprox_aaw_trains_with_the_proximal_term_and_adapts_weights():
    spec, sites = toy_federation(2, size=16, labels="full", with_val=True, n_train=4)
    cls = get_method("fedprox_aaw")
    train = TrainSettings(rounds=2, local_iters=2, batch_size=2, augment=False, loss="dice_bce")
    sim = Simulation(cls(cls.Config(mu=0.1), spec), sites, train, seed=0)
    records = [sim.round(r) for r in range(2)]
    client = records[1]["clients"]["site0"]
    assert client["prox"] > 0 and {GLOBAL_LOSS, LOCAL_LOSS} <= set(client)
    assert records[1]["server"]["aaw_weights"] != records[0]["server"]["aaw_weights"]


def test_weight_plot_reads_rounds_jsonl(tmp_path):
    records = [
        {"round": 0, "server": {"aaw_weights": {"A": 0.4, "B": 0.6}}},
        {"round": 1, "server": {"aaw_weights": {"A": 0.3, "B": 0.7}}},
    ]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert load_weight_history(tmp_path) == {"A": [(0, 0.4), (1, 0.3)], "B": [(0, 0.6), (1, 0.7)]}
    png = plot_weights(tmp_path, tmp_path / "w.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="aaw_weights"):
        load_weight_history([{"round": 0, "server": {}}])
