"""Settings under which DP is known to work: adaptive clipping (Andrew et al. 2021), server
momentum, and training part of a network initialised from another run (init_from + freeze)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.server import ServerCore, make_method
from fedseg.errors import ConfigError
from fedseg.methods import Payload
from fedseg.privacy import PrivacySettings, epsilon
from fedseg.privacy.central import adaptive_noise
from fedseg.testing import synth_folder, toy_federation

SMALL = {"name": "unet", "widths": [8, 16], "dropout": [0, 0], "norm": "group"}


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "faz", "faz", sites=3, per_site=6)


def _cfg(root: Path, privacy: dict, rounds: int = 2, seed: int = 3, model: dict = SMALL):
    return parse_config(
        {
            "seed": seed,
            "data": {"root": str(root), "labels": "full"},
            "method": {"name": "fedavg"},
            "model": model,
            "train": {"rounds": rounds, "local_iters": 2, "batch_size": 4, "augment": False},
            "eval": {"every": 0},
            "engine": {"device": "cpu"},
            "privacy": privacy,
        }
    )


def _server(privacy: dict, sites: int) -> ServerCore:
    spec, _ = toy_federation(sites)
    cfg = _cfg(Path("unused"), {"mode": "central", **privacy})
    return ServerCore(make_method(cfg, spec), cfg.train, cfg.seed)


def _round(server: ServerCore, r: int, norms: dict[str, float]) -> dict:
    """One server round on updates of the given norms (all values equal); its metrics."""
    agg = server.aggregator(r)
    for site, n in norms.items():
        base = server.payloads[site].tensors
        size = sum(t.numel() for t in base.values() if t.is_floating_point())
        up = {k: torch.full_like(t, n / math.sqrt(size)) for k, t in base.items()}
        agg.add(site, Payload(up, num_examples=server.spec.site(site).num_train))
    return server.finish(agg)


def test_adaptive_noise_costs_what_one_gaussian_of_the_multiplier_costs():
    """z_update and sigma_b split z as Flower's helper splits it, and a round of both
    releases has exactly the RDP (so epsilon) of one Gaussian release of multiplier z."""
    flwr_dp = pytest.importorskip("flwr.supercore.differential_privacy")
    settings = PrivacySettings(
        mode="central", noise_multiplier=1.2, delta=1e-5, adaptive_clip={"count_noise": 2.0}
    )
    z_update, sd = adaptive_noise(settings, sites=40)
    assert (sd, z_update) == pytest.approx(flwr_dp.compute_adaptive_noise_params(1.2, 40, 2.0))
    assert z_update > 1.2
    pair = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_update), dpa.GaussianDpEvent(2 * sd)])
    eps = dpa.rdp.RdpAccountant().compose(dpa.SelfComposedDpEvent(pair, 30)).get_epsilon(1e-5)
    assert eps == pytest.approx(epsilon(settings, 30), rel=1e-9)
    default = PrivacySettings(mode="central", noise_multiplier=1.2, adaptive_clip={})
    assert adaptive_noise(default, 40)[1] == 2.0  # sites / 20
    with pytest.raises(ConfigError, match=r"count_noise: 0\.25 is too small"):
        adaptive_noise(default, 5)


def test_adaptive_clip_follows_the_geometric_rule_to_the_quantile():
    """Ten sites with update norms 1..10: the clip follows clip * exp(-eta (b - gamma)) with
    b the noised unclipped share, round after round, and settles between the 3rd and 8th
    norm from a start at 0.5; the updates' noise scales with the current clip."""
    privacy = {
        "clip": 0.5,
        "noise_multiplier": 0.5,
        "adaptive_clip": {"quantile": 0.5, "learning_rate": 0.3, "count_noise": 0.5},
    }
    server = _server(privacy, sites=10)
    norms = {s: float(i + 1) for i, s in enumerate(server.spec.site_names)}
    z_update, _ = adaptive_noise(PrivacySettings(mode="central", **privacy), 10)
    clip, clips = 0.5, []
    for r in range(80):
        m = _round(server, r, norms)
        assert m["dp_clip"] == pytest.approx(clip)
        assert m["dp_noise_std"] == pytest.approx(z_update * clip / 10)
        clip *= math.exp(-0.3 * (m["dp_unclipped_share"] - 0.5))
        clips.append(clip)
    assert clips[15] > 2.0  # it grows while every update is clipped
    assert 3.0 < sum(clips[-20:]) / 20 < 8.0


def test_server_momentum_moves_by_the_momentum_average():
    """The same update u every round, noise negligible: after 3 rounds the global model has
    moved by (1 + (1 + b) + (1 + b + b^2)) u."""
    beta = 0.5
    server = _server({"clip": 10.0, "noise_multiplier": 1e-9, "server_momentum": beta}, 2)
    start = dict(server.payloads["site0"].tensors)
    for r in range(3):
        _round(server, r, {"site0": 1.0, "site1": 1.0})
    key = next(k for k in start if k.endswith("weight"))
    size = sum(t.numel() for t in start.values() if t.is_floating_point())
    moved = server.payloads["site0"].tensors[key].double() - start[key].double()
    expected = (3 + 2 * beta + beta**2) / math.sqrt(size)
    torch.testing.assert_close(moved, torch.full_like(moved, expected), rtol=1e-5, atol=1e-9)


def test_options_outside_their_mode_refuse():
    for bad, why in (
        ({"mode": "local", "adaptive_clip": {}}, "adaptive_clip needs mode: central"),
        ({"mode": "local", "server_momentum": 0.9}, "server_momentum needs mode: central"),
        ({"mode": "central", "freeze": ["encoder.*"]}, "freeze needs init_from"),
        (
            {"mode": "central", "adaptive_clip": {}, "secure_aggregation": {}},
            "does not combine with secure_aggregation",
        ),
    ):
        with pytest.raises(ValueError, match=why):
            PrivacySettings(**bad)


def _tensors(run: Path) -> dict[str, torch.Tensor]:
    ck = torch.load(run / "checkpoints/last.pt", weights_only=True)
    return ck["server"]["payloads"][0]["tensors"]


@pytest.mark.parametrize("mode", ["central", "local"])
def test_training_only_the_decoder_from_a_run_without_dp(fed_root, tmp_path, mode):
    """A run without DP initialises the network; under DP only the decoder trains: the
    encoder stays bit for bit that run's (no update, no noise), the decoder moves."""
    pre = tmp_path / "pre"
    InProcessRunner(_cfg(fed_root, {"mode": "off"}, rounds=1, seed=9), pre).run()
    privacy = {
        "mode": mode,
        "clip": 0.5,
        "noise_multiplier": 0.8,
        "init_from": str(pre),
        "freeze": ["encoder.*"],
    }
    InProcessRunner(_cfg(fed_root, privacy), tmp_path / "dp").run()
    before, after = _tensors(pre), _tensors(tmp_path / "dp")
    encoder = [k for k in before if k.startswith("encoder.")]
    decoder = [k for k in before if k.startswith("decoder.") and before[k].is_floating_point()]
    assert encoder and all(torch.equal(after[k], before[k]) for k in encoder)
    assert all(not torch.equal(after[k], before[k]) for k in decoder)


def test_init_from_without_dp_and_its_errors(fed_root, tmp_path):
    pre = tmp_path / "pre"
    InProcessRunner(_cfg(fed_root, {"mode": "off"}, rounds=1, seed=9), pre).run()
    spec = toy_federation(3)[0]
    cfg = _cfg(fed_root, {"init_from": str(pre / "checkpoints/last.pt"), "freeze": ["decoder.*"]})
    model = make_method(cfg, spec).build_model()
    assert all(p.requires_grad == n.startswith("encoder.") for n, p in model.named_parameters())
    assert torch.equal(
        model.state_dict()["encoder.blocks.0.0.weight"], _tensors(pre)["encoder.blocks.0.0.weight"]
    )
    InProcessRunner(cfg, tmp_path / "run").run()  # trains the encoder only, without DP
    frozen = [k for k in _tensors(pre) if k.startswith("decoder.")]
    assert all(torch.equal(_tensors(tmp_path / "run")[k], _tensors(pre)[k]) for k in frozen)
    for privacy, why in (
        ({"init_from": str(pre), "freeze": ["head.*"]}, r"'head.\*' matches no parameter"),
        ({"init_from": str(tmp_path / "none.pt")}, "expected a fedseg run directory"),
    ):
        with pytest.raises(ConfigError, match=why):
            make_method(_cfg(fed_root, privacy), spec).build_model()
    wide = _cfg(fed_root, {"init_from": str(pre)}, model={**SMALL, "widths": [16, 32]})
    with pytest.raises(ConfigError, match="the checkpoint is of another network"):
        make_method(wide, spec).build_model()


def test_adaptive_clip_run_reports_the_clip_each_round_and_the_accounted_epsilon(
    fed_root, tmp_path
):
    privacy = {
        "mode": "central",
        "clip": 0.2,
        "noise_multiplier": 0.5,
        "adaptive_clip": {"count_noise": 1.0},
        "server_momentum": 0.9,
    }
    res = InProcessRunner(_cfg(fed_root, privacy, rounds=3), tmp_path / "r").run()
    rounds = [json.loads(x) for x in (tmp_path / "r/rounds.jsonl").read_text().splitlines()]
    clips = [r["server"]["dp_clip"] for r in rounds]
    assert clips[0] == 0.2 and len(set(clips)) == 3
    assert res["privacy"]["epsilon"] == epsilon(PrivacySettings(**privacy), 3)
