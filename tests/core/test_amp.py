"""Mixed precision and channels-last: ``engine.amp``/``engine.channels_last`` settings and
tiny federations run under :func:`fedseg.methods.training.precision` on CPU."""

from __future__ import annotations

import pydantic
import pytest
import torch

from fedseg.config import parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError
from fedseg.evaluation import predict
from fedseg.methods.training import autocast, current_precision, precision
from fedseg.models.unet import UNet


def _config(tmp_path, method: dict | None = None, **engine):
    return parse_config(
        {
            "name": "amp",
            "data": {
                "root": str(tmp_path / "data"),
                "synth": {"task": "fundus", "sites": 2, "size": 32, "per_site": 8},
            },
            "method": method or {"name": "fedavg"},
            "model": {"widths": [8, 16, 32], "dropout": [0, 0, 0]},
            "train": {"rounds": 1, "local_iters": 2, "batch_size": 2},
            "engine": {"device": "cpu", **engine},
        }
    )


def _run(
    tmp_path, name: str, method: dict | None = None, **setting
) -> dict[tuple[str, ...], float]:
    """Every site's training loss and test metric of a 1-round federation whose config sets
    ``engine`` to ``setting`` (the engine enters the precision block in each site worker)."""
    rounds: list[dict] = []
    cfg = _config(tmp_path, method, **setting)
    res = InProcessRunner(cfg, tmp_path / name).run(on_round=rounds.append)
    out = {("loss", s): float(m["loss"]) for s, m in rounds[-1]["clients"].items() if "loss" in m}
    for s, ms in res["sites"].items():
        out |= {(s, m, r): v for m, rs in ms.items() for r, v in rs.items()}
    return out


def test_settings_parse_and_bad_amp_is_named(tmp_path):
    eng = _config(tmp_path, amp="bf16", channels_last=True).engine
    assert (eng.amp, eng.channels_last) == ("bf16", True)
    assert _config(tmp_path).engine.amp == "auto"  # bf16 where native and shown safe
    with pytest.raises((ConfigError, pydantic.ValidationError), match="amp"):
        _config(tmp_path, amp="fp8")
    with pytest.raises(ConfigError, match=r"engine\.amp"), precision("fp8"):  # type: ignore[arg-type]
        pass


def test_bf16_autocast_runs_a_federation_on_cpu(tmp_path):
    net = UNet(3, 3, channels=(8, 16), dropout_p=(0, 0))
    x = torch.randn(1, 3, 32, 32)
    with precision("bf16"), autocast(torch.device("cpu")):
        assert net(x).dtype == torch.bfloat16
    assert current_precision().amp == "off"  # the block restores the default
    full, half = _run(tmp_path, "fp32", amp="off"), _run(tmp_path, "bf16", amp="bf16")
    assert full.keys() == half.keys()
    assert all(torch.isfinite(torch.tensor(v)) for v in half.values())
    for site in ("A", "B"):  # the training forwards ran in bf16: close, not equal
        assert half["loss", site] != full["loss", site]
        assert half["loss", site] == pytest.approx(full["loss", site], rel=0.05)


def test_fp16_is_refused_off_cuda_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"engine\.amp.*CUDA"):
        _run(tmp_path, "fp16", amp="fp16")


def test_channels_last_gives_the_same_results(tmp_path):
    net = UNet(3, 3, channels=(8, 16), dropout_p=(0, 0))
    x = torch.randn(3, 3, 32, 32)
    plain = predict(net, x, 2, torch.device("cpu"))
    with precision(channels_last=True):
        assert torch.equal(predict(net, x, 2, torch.device("cpu")), plain)
    assert all(p.is_contiguous() for p in net.parameters())  # layout restored
    full, last = _run(tmp_path, "fp32", amp="off"), _run(tmp_path, "cl", channels_last=True)
    assert full.keys() == last.keys()
    for k, v in full.items():
        assert last[k] == pytest.approx(v, abs=1e-3), k


def test_harmofl_trains_under_bf16_and_refuses_fp16_naming_why(tmp_path):
    harmofl = {"name": "harmofl"}
    full, half = (
        _run(tmp_path, "fp32", harmofl, amp="off"),
        _run(tmp_path, "bf16", harmofl, amp="bf16"),
    )
    for site in ("A", "B"):  # its own loop (weight-perturbed steps) ran the forwards in bf16
        assert half["loss", site] != full["loss", site]
        assert half["loss", site] == pytest.approx(full["loss", site], rel=0.05)
    last = _run(tmp_path, "cl", harmofl, channels_last=True)
    assert all(last[k] == pytest.approx(v, abs=1e-3) for k, v in full.items())
    with pytest.raises(ConfigError, match=r"engine\.amp.*harmofl.*bf16"):
        _run(tmp_path, "fp16", harmofl, amp="fp16")


def test_iopfl_test_time_adaptation_runs_under_the_engine_precision(tmp_path, monkeypatch):
    import fedseg.methods.iopfl as iopfl

    seen: list[bool] = []
    loss = iopfl.adaptation_loss

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(torch.is_autocast_enabled("cpu"))
        return loss(*args, **kwargs)

    monkeypatch.setattr(iopfl, "adaptation_loss", recorded)
    method = {"name": "iopfl", "unseen": ["B"], "tta_epochs": 1}
    half = _run(tmp_path, "bf16", method, amp="bf16")
    assert seen and all(seen)  # the unseen site B adapted its routers under bf16 autocast
    assert all(torch.isfinite(torch.tensor(v)) for v in half.values())
    seen.clear()
    _run(tmp_path, "fp32", method, amp="off")
    assert seen and not any(seen)
