"""Central DP (DP-FedAvg): clipping, calibrated noise, accountant, repeatable runs, refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from scipy.stats import norm

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.server import ServerCore, make_method
from fedseg.errors import ConfigError
from fedseg.methods import Payload
from fedseg.privacy import PrivacySettings, epsilon, rounds_within_budget, supported_methods
from fedseg.privacy.central import update_norm
from fedseg.testing import synth_folder, toy_federation

SMALL = {"name": "unet", "widths": [4, 8, 16], "dropout": [0, 0, 0]}


@pytest.fixture(scope="module")
def fed_root(tmp_path_factory) -> Path:
    return synth_folder(tmp_path_factory.mktemp("fed") / "faz", "faz", sites=3, per_site=6)


def _cfg(root: Path, privacy: dict, method: str = "fedavg", rounds: int = 2, seed: int = 3):
    return parse_config(
        {
            "seed": seed,
            "data": {"root": str(root), "labels": "full"},
            "method": {"name": method},
            "model": SMALL,
            "train": {"rounds": rounds, "local_iters": 2, "batch_size": 4, "augment": False},
            "eval": {"every": 0},
            "engine": {"device": "cpu"},
            "privacy": privacy,
        }
    )


def _server(privacy: dict, sites: int = 3) -> ServerCore:
    spec, _ = toy_federation(sites)
    cfg = _cfg(Path("unused"), {"mode": "central", **privacy})
    return ServerCore(make_method(cfg, spec), cfg.train, cfg.seed)


def _aggregate(server: ServerCore, updates: dict[str, dict[str, torch.Tensor]], r: int = 0):
    agg = server.aggregator(r)
    for site, up in updates.items():
        agg.add(site, Payload(up, num_examples=server.spec.site(site).num_train))
    base = dict(server.payloads[server.spec.site_names[0]].tensors)
    metrics = server.finish(agg)
    new = server.payloads[server.spec.site_names[0]].tensors
    return {k: new[k].double() - base[k].double() for k in base}, metrics


def _zeros(server: ServerCore) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(t) for k, t in server.payloads["site0"].tensors.items()}


def test_clipping_bounds_every_sites_contribution():
    """A site with a huge update moves the aggregate by at most clip / m (its weight)."""
    clip, m = 0.5, 3
    gen = torch.Generator().manual_seed(1)
    small = {
        s: {
            k: 1e-3 * torch.randn(t.shape, generator=gen) if t.is_floating_point() else t
            for k, t in _zeros(_server({})).items()
        }
        for s in ("site1", "site2")
    }
    huge = {
        k: 1e4 * torch.randn(t.shape, generator=gen) if t.is_floating_point() else t
        for k, t in _zeros(_server({})).items()
    }
    moved = {}
    for name, site0 in (("huge", huge), ("none", _zeros(_server({})))):
        server = _server({"clip": clip, "noise_multiplier": 1.0})
        moved[name], _ = _aggregate(server, {"site0": site0, **small})
    diff = {k: moved["huge"][k] - moved["none"][k] for k in moved["huge"]}  # same noise draws
    assert update_norm(diff) == pytest.approx(clip / m, rel=1e-5)
    assert update_norm(huge) > 1e4 * clip


def _noised(key: str, value: torch.Tensor) -> bool:
    """Float values whose noise is not clamped (variances are kept >= 0)."""
    return value.is_floating_point() and not key.endswith(("running_var", "num_batches_tracked"))


def test_noise_has_the_calibrated_standard_deviation():
    """Zero updates: what the aggregate moves is the noise, N(0, (z C max_w)^2) per value."""
    z, clip = 1.5, 0.2
    for weighting, max_w in (("uniform", 1 / 3), ("samples", None)):
        server = _server({"clip": clip, "noise_multiplier": z, "weighting": weighting})
        if max_w is None:  # toy sites hold 8, 10 and 12 samples
            max_w = 12 / 30
        draws = []
        for r in range(5):  # five rounds: five independently seeded draws of the model
            zeros = {s: _zeros(server) for s in server.spec.site_names}
            moved, metrics = _aggregate(server, zeros, r)
            draws += [v.flatten() for k, v in moved.items() if _noised(k, v)]
        x = torch.cat(draws)
        n, sd = x.numel(), z * clip * max_w
        assert metrics["dp_noise_std"] == pytest.approx(sd)
        assert n > 20_000
        # sample sd within 6 standard errors (sd / sqrt(2n)), mean within 6 (sd / sqrt(n))
        assert abs(float(x.std()) - sd) < 6 * sd / math.sqrt(2 * n)
        assert abs(float(x.mean())) < 6 * sd / math.sqrt(n)
        # and Gaussian: the share beyond 2 sd matches the normal tail within 6 standard errors
        tail, p = float((x.abs() > 2 * sd).double().mean()), 2 * norm.sf(2)
        assert abs(tail - p) < 6 * math.sqrt(p * (1 - p) / n)


def test_epsilon_bounds_the_exact_gaussian_composition_tightly():
    """T Gaussian releases of multiplier z compose exactly to one of mu = sqrt(T) / z, whose
    delta(eps) is known in closed form (Balle & Wang 2018): at our epsilon it is at most the
    configured delta (a valid bound), and at 0.8 epsilon already above it (a tight one)."""

    def exact_delta(eps: float, mu: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    for z, rounds in ((1.0, 50), (2.0, 50), (5.0, 20)):
        settings = PrivacySettings(mode="central", noise_multiplier=z, delta=1e-3)
        eps, mu = epsilon(settings, rounds), math.sqrt(rounds) / z
        assert exact_delta(eps, mu) <= 1e-3 < exact_delta(0.8 * eps, mu)


def test_accountant_matches_the_library_round_by_round():
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    settings = PrivacySettings(mode="central", noise_multiplier=1.3, delta=1e-5)
    acc = RdpAccountant()
    for r in range(1, 8):
        acc.compose(dpa.GaussianDpEvent(1.3))
        assert epsilon(settings, r) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    target = settings.model_copy(update={"target_epsilon": epsilon(settings, 4) + 1e-9})
    assert rounds_within_budget(target, 10) == 4


def test_dp_run_is_repeatable_resumable_reports_epsilon_and_stops_at_the_target(fed_root, tmp_path):
    privacy = {"mode": "central", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-4}
    settings = PrivacySettings(**privacy)
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        runs[name] = InProcessRunner(_cfg(fed_root, privacy, seed=seed), tmp_path / name).run()

    def model(name):
        ck = torch.load(tmp_path / name / "checkpoints/last.pt", weights_only=True)
        return ck["server"]["payloads"][0]["tensors"]

    a, b, c = model("a"), model("b"), model("c")
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed: the same noise, bit for bit
    assert runs["a"]["sites"] == runs["b"]["sites"]
    assert any(not torch.equal(a[k], c[k]) for k in a)
    rounds = [json.loads(x) for x in (tmp_path / "a/rounds.jsonl").read_text().splitlines()]
    assert [r["server"]["dp_epsilon"] for r in rounds] == [
        epsilon(settings, 1),
        epsilon(settings, 2),
    ]
    norms = [m["update_norm"] for r in rounds for m in r["clients"].values()]
    assert len(norms) == 6 and all(n > 0 for n in norms)  # three sites, two rounds
    report = json.loads((tmp_path / "a/results.json").read_text())["privacy"]
    assert report["epsilon"] == epsilon(settings, 2) and report["rounds"] == 2
    assert report["delta"] == 1e-4 and report["clip"] == 0.5

    class Crash(Exception):
        pass

    def crash_after_round_1(record):
        if record["round"] == 0:
            raise Crash

    with pytest.raises(Crash):  # a crashed and resumed run draws the same noise
        InProcessRunner(_cfg(fed_root, privacy), tmp_path / "r").run(on_round=crash_after_round_1)
    resumed = InProcessRunner(_cfg(fed_root, privacy), tmp_path / "r").run(resume=True)
    assert resumed["sites"] == runs["a"]["sites"] and resumed["privacy"] == runs["a"]["privacy"]
    r = model("r")
    assert all(torch.equal(a[k], r[k]) for k in a)

    target = {**privacy, "target_epsilon": epsilon(settings, 2) + 1e-9}
    res = InProcessRunner(_cfg(fed_root, target, rounds=5), tmp_path / "t").run()
    assert len((tmp_path / "t/rounds.jsonl").read_text().splitlines()) == 2
    assert res["privacy"]["epsilon"] <= target["target_epsilon"]


@pytest.mark.parametrize(
    ("method", "step"),
    [
        ("fedlppa", "FedLPPA.server_step"),
        ("fedap", "FedAP.server_step"),
        ("fedavg_aaw", "AdaptiveWeights.server_step"),
        ("fedproto", "server_step"),
        ("centralized", "server_step"),
    ],
)
def test_methods_that_need_individual_uploads_refuse(method, step):
    with pytest.raises(
        ConfigError, match=rf"privacy.mode central: method '{method}' is not supported.*{step}"
    ):
        _cfg(Path("x"), {"mode": "central"}, method=method)


@pytest.mark.parametrize("method", supported_methods())
def test_every_supported_method_runs_with_central_dp(fed_root, tmp_path, method):
    """Each method the wrapper accepts completes a DP round with every site (its client step
    under the wrapper, its private parts kept) and reports epsilon."""
    privacy = {"mode": "central", "clip": 0.5, "noise_multiplier": 0.8}
    res = InProcessRunner(_cfg(fed_root, privacy, method, rounds=1), tmp_path / "r").run()
    assert res["privacy"]["epsilon"] == epsilon(PrivacySettings(**privacy), 1)
    record = json.loads((tmp_path / "r/rounds.jsonl").read_text())
    assert len(record["participants"]) == 3 and not record["failures"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_central_dp_trains_on_cuda_like_on_the_cpu(fed_root, tmp_path):
    """Sites train on the GPU while the server's global model, noise and sum stay on the
    CPU: the run completes, and with the same seed (the same noise) its global model is the
    CPU run's up to the GPU's rounding, far below the noise's standard deviation (0.13)."""
    privacy = {
        "mode": "central",
        "clip": 0.5,
        "noise_multiplier": 0.8,
        "server_momentum": 0.9,
        "adaptive_clip": {"quantile": 0.5, "learning_rate": 0.2, "count_noise": 1.0},
    }
    models = {}
    for device in ("cpu", "cuda"):
        cfg = _cfg(fed_root, privacy)
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"device": device})})
        InProcessRunner(cfg, tmp_path / device).run()
        ck = torch.load(tmp_path / device / "checkpoints/last.pt", weights_only=True)
        models[device] = ck["server"]["payloads"][0]["tensors"]
    diff = max(float((models["cpu"][k] - models["cuda"][k]).abs().max()) for k in models["cpu"])
    assert diff < 0.02
