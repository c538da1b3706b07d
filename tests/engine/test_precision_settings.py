"""``engine.amp``/``engine.channels_last`` as a user types them, their ``auto`` resolution
per network and device, the precision recorded in results.json, and the 3D UNet trained
under bf16 + channels-last (issue 29) with every upload and weight finite."""

from __future__ import annotations

import pytest
import torch

import fedseg.methods.training as training
from fedseg.config import apply_overrides, parse_config
from fedseg.engine.rundir import RunDir
from fedseg.engine.runner import InProcessRunner
from fedseg.errors import ConfigError
from fedseg.evaluation import predict
from fedseg.methods.training import Precision
from fedseg.models import parse_model
from fedseg.reproduce.harness import finished_run
from fedseg.reproduce.runs import interrupted_run

CPU = torch.device("cpu")


def _raw(tmp_path, task: str = "fundus", size: int = 32, **engine) -> dict:
    return {
        "name": "precision",
        "data": {
            "root": str(tmp_path / f"data-{task}"),
            "synth": {"task": task, "sites": 2, "size": size, "per_site": 6},
        },
        "method": {"name": "fedavg"},
        "model": {"widths": [8, 16, 32], "dropout": [0, 0, 0]},
        "train": {"rounds": 1, "local_iters": 2, "batch_size": 2},
        "eval": {"save_models": False},
        "engine": {"device": "cpu", **engine},
    }


@pytest.mark.parametrize(
    ("typed", "amp"),
    [("off", "off"), ("false", "off"), ("OFF", "off"), ("on", "auto"), ("true", "auto")],
)
def test_amp_accepts_what_a_user_types_in_set_and_yaml(tmp_path, typed, amp):
    raw = apply_overrides(_raw(tmp_path), [f"engine.amp={typed}"])  # YAML-parsed, as --set
    assert parse_config(raw).engine.amp == amp


def test_channels_last_words_default_auto_and_bad_values_named(tmp_path):
    assert parse_config(_raw(tmp_path)).engine.channels_last == "auto"
    for typed, want in [("off", False), ("on", True), ("auto", "auto"), ("true", True)]:
        raw = apply_overrides(_raw(tmp_path), [f"engine.channels_last={typed}"])
        assert parse_config(raw).engine.channels_last == want
    with pytest.raises(ConfigError, match=r"engine\.channels_last.*auto, true or false"):
        parse_config(_raw(tmp_path, channels_last="maybe"))
    with pytest.raises(ConfigError, match=r"engine\.amp"):
        parse_config(_raw(tmp_path, amp="fp8"))


def test_auto_resolves_from_the_cpu_flags_and_the_network(monkeypatch):
    unet = parse_model({"name": "unet"})
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert Precision("auto", "auto").resolve(unet, 2, CPU) == Precision("off", True)
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert Precision("auto", "auto").resolve(unet, 2, CPU) == Precision("bf16", True)
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    # 3D networks stay float32 and contiguous under auto (not compared over seeds); bf16 forced
    assert Precision("auto", "auto").resolve(unet, 3, CPU) == Precision("off", False)
    assert Precision("bf16", "auto").resolve(unet, 3, CPU) == Precision("bf16", False)
    assert Precision("off", True).resolve(unet, 3, CPU) == Precision("off", True)  # explicit
    assert Precision("auto", False).resolve(unet, 2, torch.device("mps")).amp == "off"
    # a method whose 3-seed comparison failed keeps float32 under auto
    assert Precision("auto", "auto").resolve(unet, 2, CPU, method_bf16=False).amp == "off"
    pvt = parse_model({"name": "pvtv2_fpn"})  # measured no faster in channels-last or bf16
    assert Precision("off", "auto").resolve(pvt, 2, CPU) == Precision("off", False)
    assert Precision("auto", "auto").resolve(pvt, 2, CPU) == Precision("off", False)
    with pytest.raises(ConfigError, match=r"engine\.amp"), training.precision("auto"):  # type: ignore[arg-type]
        pass


@pytest.mark.parametrize("flags", [frozenset(), frozenset({"amx_bf16"})])
def test_results_record_the_precision_the_run_used(tmp_path, monkeypatch, flags):
    monkeypatch.setattr(training, "cpu_flags", lambda: flags)
    seen: list[str] = []
    steps = training.backward_step

    def recorded(opt, loss, scaler, clamp=None):  # type: ignore[no-untyped-def]
        seen.append(training.current_precision().amp)  # what autocast() of the step read
        steps(opt, loss, scaler, clamp)

    monkeypatch.setattr(training, "backward_step", recorded)
    cfg = parse_config(_raw(tmp_path, amp="auto"))
    res = InProcessRunner(cfg, tmp_path / "run").run()
    amp = "bf16" if flags else "off"
    assert res["precision"] == {"amp": amp, "channels_last": True, "native_bf16": bool(flags)}
    assert seen and set(seen) == {amp}  # every site step ran at the recorded precision
    # and the machine, for reading its timings
    assert res["machine"]["device"] == "cpu" and res["machine"]["torch"] == torch.__version__
    assert res["machine"]["cpu"] and res["machine"]["cores"] >= 1
    # reproduce reuses an auto run only on hardware where auto resolves the same way
    assert finished_run(tmp_path / "run", cfg)
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"amx_bf16"} - flags))
    assert not finished_run(tmp_path / "run", cfg)


@pytest.mark.parametrize("flags", [frozenset(), frozenset({"amx_bf16"})])
def test_an_auto_run_cut_off_resumes_only_where_auto_resolves_the_same(
    tmp_path, monkeypatch, flags
):
    monkeypatch.setattr(training, "cpu_flags", lambda: flags)
    raw = _raw(tmp_path, amp="auto")
    raw["train"]["rounds"] = 2
    cfg, run = parse_config(raw), tmp_path / "run"

    def stop_after_round_0(record):  # type: ignore[no-untyped-def]
        if record["round"] == 0:
            raise KeyboardInterrupt  # the session ends mid-run

    with pytest.raises(KeyboardInterrupt):
        InProcessRunner(cfg, run).run(on_round=stop_after_round_0)
    assert RunDir(run).load_checkpoint()["precision"]["native_bf16"] == bool(flags)
    assert interrupted_run(run, cfg)
    config = (run / "config.yaml").read_text()
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"amx_bf16"} - flags))
    assert not interrupted_run(run, cfg)  # reproduce starts it afresh here
    with pytest.raises(ConfigError, match=r"cannot resume here: the run trained with amp"):
        InProcessRunner(cfg, run).run(resume=True)
    assert (run / "config.yaml").read_text() == config and not (run / "resumes.jsonl").exists()
    monkeypatch.setattr(training, "cpu_flags", lambda: flags)
    assert InProcessRunner(cfg, run).run(resume=True)["precision"]["native_bf16"] == bool(flags)


def _tensors(obj: object) -> list[torch.Tensor]:
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return [t for v in getattr(obj, "__dict__", {}).values() for t in _tensors(v)]


def test_3d_bf16_channels_last_is_refused_on_a_cpu_without_amx(tmp_path, monkeypatch):
    """Issue 29: the report came from a CPU with avx512_bf16 and no AMX; refused there."""
    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    raw = _raw(tmp_path, "pancreas3d", 32, amp="bf16", channels_last=True)
    raw["model"] = {"name": "unet"}
    raw["data"]["synth"] = {"task": "pancreas3d", "size": 32, "per_site": 6, "weak_labels": False}
    raw["data"]["sites"] = ["A", "B"]
    with pytest.raises(ConfigError, match="channels_last: true with bf16 on a 3D network"):
        InProcessRunner(parse_config(raw), tmp_path / "p3d").run()
    auto = Precision("bf16", "auto").resolve(parse_model({"name": "unet"}), 3, CPU)
    assert auto == Precision("bf16", False)  # the default layout keeps 3D contiguous


def test_3d_unet_trains_finite_under_bf16_and_channels_last(tmp_path, monkeypatch):
    """Issue 29: the full 3D UNet, bf16 autocast and channels-last-3d forced on, 32^3 (on a
    CPU with AMX, where the combination is allowed)."""
    if "amx_bf16" not in training.cpu_flags():
        pytest.skip("bf16 + channels-last in 3D is refused on a CPU without AMX")
    steps: list[Precision] = []
    step = training.backward_step

    def checked(opt, loss, scaler, clamp=None):  # type: ignore[no-untyped-def]
        assert torch.isfinite(loss), f"non-finite loss at step {len(steps)}"
        step(opt, loss, scaler, clamp)
        params = [p for group in opt.param_groups for p in group["params"]]
        assert all(torch.isfinite(p).all() for p in params), f"weight at step {len(steps)}"
        steps.append(training.current_precision())

    monkeypatch.setattr(training, "backward_step", checked)
    raw = _raw(tmp_path, "pancreas3d", 32, amp="bf16", channels_last=True)
    raw["model"] = {"name": "unet"}
    raw["data"]["synth"] = {"task": "pancreas3d", "size": 32, "per_site": 6, "weak_labels": False}
    raw["data"]["sites"] = ["A", "B", "C"]
    raw["train"] |= {"rounds": 2, "loss": "dice_bce", "optimizer": "adamw", "lr": 1e-3}
    records: list[dict] = []
    res = InProcessRunner(parse_config(raw), tmp_path / "p3d").run(on_round=records.append)
    assert [r["failures"] for r in records] == [{}, {}]  # no upload refused
    assert all(len(r["participants"]) == 3 for r in records)
    assert len(steps) == 3 * 2 * 2 and set(steps) == {Precision("bf16", True)}
    server = RunDir(tmp_path / "p3d").load_checkpoint()["server"]
    weights = [t for t in _tensors(server) if t.is_floating_point()]
    assert weights and all(torch.isfinite(t).all() for t in weights)
    assert res["precision"] == {"amp": "bf16", "channels_last": True, "native_bf16": True}


def test_prediction_in_inference_mode_leaves_a_trainable_model():
    net = parse_model({"name": "unet", "widths": [8, 16], "dropout": [0, 0]}).build(1, 2, 2)
    x = torch.randn(2, 1, 32, 32)
    modes: list[bool] = []
    net.register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    with training.precision("bf16", channels_last=True):
        labels = predict(net, x, 2, CPU)
    assert modes == [True] and labels.shape == (2, 32, 32)
    assert not any(p.is_inference() for p in net.parameters())
    assert all(p.is_contiguous() for p in net.parameters())
    net.train()
    net(x).sum().backward()  # an inference tensor among the weights would refuse this
    assert modes == [True, False]
    assert all(p.grad is not None for p in net.parameters())
