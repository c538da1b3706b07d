"""``method.variant: authors`` (issue 47): the settings it fixes, conflicts, the run dump,
the options it needs, and a one-round run per method."""

import re
from pathlib import Path

import pytest
import torch
import yaml

from fedseg.config import dump_config, load_config, parse_config
from fedseg.engine.runner import InProcessRunner
from fedseg.engine.simulation import Simulation
from fedseg.engine.sites import client_context
from fedseg.errors import ConfigError
from fedseg.methods import Payload, ServerContext, TrainSettings, get_method
from fedseg.methods.base import batches_per_epoch
from fedseg.methods.pseudo_label import dual_decoder_loss
from fedseg.testing import synth_folder, toy_federation

METHODS = ("fedlppa", "fedbcs", "feddp")
DOCS = Path(__file__).parents[2] / "docs" / "methods"


def _cfg(method: dict, train: dict | None = None, root: str = "x"):
    return parse_config({"data": {"root": root}, "method": method, "train": train or {}})


def _documented(method: str) -> dict[str, dict]:
    """The ``| `where.key` | `value` | source |`` rows of the page's "variant: authors"."""
    page = (DOCS / f"{method}.md").read_text()
    section = page.split("## variant: authors", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict] = {"method": {}, "train": {}, "model": {}}
    row = re.compile(r"^\| `(method|train|model)\.(\w+)` \| `([^`]*)` \|", re.M)
    for where, key, value in row.findall(section):
        out[where][key] = yaml.safe_load(value)
    return out


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("method", METHODS)
def test_authors_variant_resolves_to_exactly_the_documented_settings(method):
    variant = get_method(method).Config.variants["authors"]
    doc = _documented(method)
    fixed_or_filled = {**variant.defaults, **variant.method}
    assert doc["method"] == {k: _plain(v) for k, v in fixed_or_filled.items()}
    assert doc["train"] == dict(variant.train)
    assert doc["model"] == {k: v for block in variant.model.values() for k, v in block.items()}
    cfg = _cfg({"name": method, "variant": "authors"})
    for key, value in doc["method"].items():
        assert cfg.method[key] == value, key
    for key, value in doc["train"].items():
        assert getattr(cfg.train, key) == value, key
    paper = _cfg({"name": method, "variant": "paper"})
    assert paper.train == TrainSettings()  # paper fixes nothing
    default = _cfg({"name": method})
    expected = "authors" if method == "fedlppa" else "paper"  # FedLPPA: parity, 2026-12-03
    assert default.method["variant"] == expected
    assert default == _cfg({"name": method, "variant": expected})


def test_fedlppa_paper_variant_is_the_papers_reading_and_fixes_nothing():
    paper = _cfg({"name": "fedlppa", "variant": "paper"})
    fields = get_method("fedlppa").Config.model_fields
    settings = [k for k in paper.method if k in fields and k != "variant"]
    assert all(paper.method[k] == _plain(fields[k].default) for k in settings)
    assert paper.method["aux_source"] == "main" and paper.method["la_skip_rounds"] == 0
    mixed = _cfg({"name": "fedlppa", "variant": "paper", "aux_source": "aux"})
    assert mixed.method["aux_source"] == "aux" and mixed.method["aux_pce"] is True


def test_fedbcs_authors_variant_leaves_the_codes_clamp_a_defect_to_the_config():
    """The code's caps make L_contra constant at tau 0.005 (a defect, not reproduced): the
    variant computes the exact InfoNCE unless ``clamp: true`` asks for the caps."""
    assert _cfg({"name": "fedbcs", "variant": "authors"}).method["clamp"] is False
    assert _cfg({"name": "fedbcs", "variant": "authors", "clamp": True}).method["clamp"] is True


def test_a_warm_up_given_in_rounds_is_kept_by_the_authors_variant():
    assert _cfg({"name": "fedlppa"}).method["la_skip_rounds"] == 50
    assert _cfg({"name": "fedlppa", "la_skip_rounds": 4}).method["la_skip_rounds"] == 4
    assert _cfg({"name": "fedlppa", "aux_strategy": "random"}).method["aux_strategy"] == "random"


def test_a_dump_without_a_variant_predates_them_and_reads_as_the_paper(tmp_path):
    cfg = _cfg({"name": "fedlppa", "variant": "paper"})
    dumped = yaml.safe_load(dump_config(cfg))
    del dumped["method"]["variant"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dumped))
    assert load_config(path, run_dump=True) == cfg
    with pytest.raises(ConfigError, match="aux_source"):
        load_config(path)  # as a hand-written config it asks for the default variant


@pytest.mark.parametrize(
    ("method", "block", "train", "named"),
    [
        ("fedlppa", {"aux_source": "main"}, {}, ["method.aux_source: 'aux'", "'main'"]),
        ("fedlppa", {}, {"weight_decay": "1e-4"}, ["train.weight_decay: 0.01", "'1e-4'"]),
        (
            "fedbcs",
            {"consis_form": "sum"},
            {"local_iters": 3},
            ["method.consis_form: 'mse'", "'sum'", "train.local_iters"],
        ),
        ("feddp", {"ft_lr": None}, {"batch_size": 12}, ["method.ft_lr: 0.0001", "12"]),
    ],
)
def test_a_conflicting_explicit_setting_is_refused_naming_both(method, block, train, named):
    with pytest.raises(ConfigError) as err:
        _cfg({"name": method, "variant": "authors", **block}, train)
    assert "method.variant 'authors' sets" in err.value.reason
    for text in named:
        assert text in err.value.reason


def test_an_explicit_setting_equal_to_the_variants_is_accepted():
    cfg = _cfg(
        {"name": "fedlppa", "variant": "authors", "la_eta": 1, "mix_low": 0},
        {"weight_decay": "1e-2", "lr": 0.01},
    )
    assert cfg.method["la_eta"] == 1.0 and cfg.train.weight_decay == 0.01 and cfg.train.lr == 0.01


@pytest.mark.parametrize("method", METHODS)
def test_the_dump_records_the_variant_and_loads_back(method, tmp_path):
    cfg = _cfg({"name": method, "variant": "authors"})
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path, run_dump=True) == cfg
    # a --set on the dump that contradicts the variant is refused, not applied silently
    key = next(iter(get_method(method).Config.variants["authors"].train))
    with pytest.raises(ConfigError, match=f"train.{key}"):
        load_config(path, [f"train.{key}=0.5"], run_dump=True)


# -- the options the variant needs ------------------------------------------------------------


def test_aux_pce_false_supervises_the_main_decoder_only():
    g = torch.Generator().manual_seed(0)
    main, aux = torch.randn(2, 2, 8, 8, generator=g), torch.randn(2, 2, 8, 8, generator=g)
    labels = torch.randint(0, 3, (2, 8, 8), generator=g)  # 2 = unlabelled
    kw = {"ignore_index": 2, "num_classes": 2, "lam": 0.5}
    both, p = dual_decoder_loss(main, aux, labels, generator=torch.Generator().manual_seed(1), **kw)
    only, q = dual_decoder_loss(
        main, aux, labels, generator=torch.Generator().manual_seed(1), aux_pce=False, **kw
    )
    assert float(both) == pytest.approx(0.5 * p["pce_main"] + 0.5 * p["pce_aux"] + 0.5 * p["pse"])
    assert float(only) == pytest.approx(q["pce_main"] + 0.5 * q["pse"])
    assert p["pce_main"] != p["pce_aux"]


def _fedlppa(spec, **cfg):
    """FedLPPA with the options given, on the paper reading (which leaves each settable)."""
    cls = get_method("fedlppa")
    return cls(cls.Config(**{"variant": "paper", **cfg}), spec)


def _step(method, sites, payload, state, train, round_index=1):
    model = method.build_model()
    ctx = client_context(
        sites["site1"],
        method.spec,
        train,
        round_index=round_index,
        seed=0,
        model=model,
        device=torch.device("cpu"),
    )
    return method.client_step(payload, state, ctx)


@pytest.mark.parametrize("restore", [True, False])
def test_restore_ddp_slots_false_leaves_weight_decay_on_the_other_slots(restore):
    spec, sites = toy_federation(3, size=32)
    method = _fedlppa(spec, restore_ddp_slots=restore, la=False)
    payload = method.init_server(method.build_model()).payloads["site1"]
    train = TrainSettings(local_iters=2, batch_size=4, augment=False, weight_decay=0.5, lr=0.1)
    res = _step(method, sites, payload, {}, train)
    new, old = res.upload.tensors["tdf.ddp"], payload.tensors["tdf.ddp"]
    assert torch.equal(new[[0, 2]], old[[0, 2]]) == restore
    if not restore:  # AdamW's decay alone moved them: shrunk towards 0
        assert (new[[0, 2]].abs() < old[[0, 2]].abs()).all()


@pytest.mark.parametrize("aux_pce", [True, False])
def test_fedlppa_aux_pce_reaches_the_clients_supervised_term(aux_pce):
    spec, sites = toy_federation(2, size=32)
    method = _fedlppa(spec, aux_pce=aux_pce, la=False)
    payload = method.init_server(method.build_model()).payloads["site1"]
    train = TrainSettings(local_iters=2, batch_size=4, augment=False)
    m = _step(method, sites, payload, {}, train).metrics
    assert m["pce_main"] != pytest.approx(m["pce_aux"])
    expected = 0.5 * m["pce_main"] + 0.5 * m["pce_aux"] if aux_pce else m["pce_main"]
    assert m["sup"] == pytest.approx(expected, rel=1e-5)


def test_la_init_own_starts_the_merge_at_the_sites_decoders():
    spec, sites = toy_federation(2, size=32)
    method = _fedlppa(spec, la_init="own", la_eta=0.0)
    model = method.build_model()
    state = method.init_client(model, spec.sites[1])
    assert all(not w.any() for w in state["la"].values())
    payload = method.init_server(model).payloads["site1"]
    prev = {k: v + 0.05 for k, v in state["decoders"].items()}
    state = {**state, "decoders": prev, "la_started": True}
    train = TrainSettings(local_iters=1, augment=False, lr=1e-12)
    res = _step(method, sites, payload, state, train)
    torch.testing.assert_close(
        res.state["decoders"]["decoder.head.bias"], prev["decoder.head.bias"], atol=1e-6, rtol=0
    )


def test_la_schedule_passes_and_skipped_rounds():
    spec, sites = toy_federation(2, size=32, n_train=8)
    train = TrainSettings(rounds=4, local_iters=1, batch_size=4, augment=False)
    method = _fedlppa(spec, la_update="sgd", la_schedule="passes", la_skip_rounds=1, la_max_iters=2)
    sim = Simulation(method, sites, train, seed=0)
    steps = [[c.get("la_steps") for c in sim.round(r)["clients"].values()] for r in range(4)]
    per_pass = [batches_per_epoch(s.num_train, 4) for s in spec.sites]
    assert steps[0] == [None, None]  # round 1 skipped: no LA
    assert steps[1] == [2 * n for n in per_pass]  # settling: passes, at most la_max_iters
    assert steps[2] == steps[3] == per_pass  # then one pass per round


@pytest.mark.parametrize(("aggregation", "mean"), [("samples", 0.9), ("uniform", 0.5)])
def test_feddp_aggregation_weights_by_samples_or_uniformly(aggregation, mean):
    spec, _ = toy_federation(2, labels="full")
    cls = get_method("feddp")
    method = cls(cls.Config(aggregation=aggregation, ft_epochs=0), spec)
    model = method.build_model()
    sd = model.state_dict()
    key = next(k for k in method.parts(model).upload if sd[k].is_floating_point())
    uploads = {
        "site0": Payload({k: sd[k] * 0 for k in method.parts(model).upload}, num_examples=1),
        "site1": Payload({k: sd[k] * 0 + 1 for k in method.parts(model).upload}, num_examples=9),
    }
    ctx = ServerContext(spec=spec, round=0, train=TrainSettings(), generator=torch.Generator())
    out = method.server_step(uploads, {}, ctx).payloads["site0"].tensors[key]
    assert torch.allclose(out, torch.full_like(out, mean))


# -- one round of each, from a config ---------------------------------------------------------

RUNS = {
    "fedlppa": ("faz", {"name": "fedlppa", "variant": "authors"}, {"local_iters": 2}),
    "fedbcs": (
        "nuclei",
        {"name": "fedbcs", "variant": "authors", "tau": 0.4},
        {"optimizer": "sgd", "lr": 0.01},
    ),
    "feddp": ("polyp", {"name": "feddp", "variant": "authors", "ft_epochs": 0}, {"lr": 1e-3}),
}


@pytest.mark.parametrize("method", METHODS)
def test_one_round_with_variant_authors_runs_and_its_dump_shows_the_settings(method, tmp_path):
    task, block, train = RUNS[method]
    root = synth_folder(tmp_path / task, task, sites=2, size=32, per_site=16)
    raw = {
        "name": f"variant-{method}",
        "data": {"root": str(root), "labels": "weak" if method == "fedlppa" else "full"},
        "method": block,
        "train": {"rounds": 1, "augment": False, **train},
        "eval": {"save_models": False, "every": 0},
        "engine": {"device": "cpu", "threads": 1},
    }
    if method == "fedbcs":
        raw["model"] = {"name": "unet", "widths": [4, 8, 16, 32], "dropout": [0.0] * 4}
    if method == "feddp":  # a narrower FPN: the variant fixes 38 steps a round
        raw["model"] = {"name": "pvtv2_fpn", "pyramid_channels": 32, "segmentation_channels": 32}
    cfg = parse_config(raw)
    result = InProcessRunner(cfg, tmp_path / "run").run()
    assert result["sites"] and all(
        0 <= v <= 1 for s in result["sites"].values() for v in s["dsc"].values()
    )
    dumped = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    variant = get_method(method).Config.variants["authors"]
    assert dumped["method"]["variant"] == "authors"
    for key, value in variant.method.items():
        assert dumped["method"][key] == _plain(value), key
    for key, value in variant.train.items():
        assert dumped["train"][key] == value, key
    for key, value in variant.model.get(dumped["model"]["name"], {}).items():
        assert dumped["model"][key] == value, key


def test_feddp_authors_variant_sets_the_codes_decoder_init_on_its_model_block():
    fpn = {"name": "pvtv2_fpn", "pyramid_channels": 32}
    authors = parse_config(
        {"data": {"root": "x"}, "method": {"name": "feddp", "variant": "authors"}, "model": fpn}
    )
    assert authors.model["decoder_init"] == "torch" and authors.model["pyramid_channels"] == 32
    paper = parse_config(
        {"data": {"root": "x"}, "method": {"name": "feddp"}, "model": {**fpn, "upsample": "logits"}}
    )
    assert paper.model["upsample"] == "logits"  # paper fixes nothing
    clash = r"model.decoder_init: 'torch' \(the config sets 'kaiming'\)"
    with pytest.raises(ConfigError, match=clash):
        parse_config(
            {
                "data": {"root": "x"},
                "method": {"name": "feddp", "variant": "authors"},
                "model": {**fpn, "decoder_init": "kaiming"},
            }
        )
    # a model the variant names no settings for is left as it is
    unet = parse_config(
        {
            "data": {"root": "x"},
            "method": {"name": "feddp", "variant": "authors"},
            "model": {"name": "unet"},
        }
    )
    assert unet.model == parse_config({"data": {"root": "x"}}).model


def test_a_dump_made_before_the_variant_gained_settings_reads_as_what_it_ran(tmp_path):
    """FedDP's ``authors`` gained the code's Dice, clamp and decoder init on 2026-12-05: a
    dump of the variant from before records the old values and reloads as ``paper`` with
    exactly those settings, where a hand-written config that says so is refused."""
    fpn = {"name": "pvtv2_fpn", "pyramid_channels": 32}
    cfg = parse_config(
        {"data": {"root": "x"}, "method": {"name": "feddp", "variant": "authors"}, "model": fpn}
    )
    dumped = yaml.safe_load(dump_config(cfg))
    dumped["train"]["loss"], dumped["train"]["grad_clamp"] = "dice", None
    del dumped["model"]["decoder_init"]  # the setting did not exist yet
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dumped))
    old = load_config(path, run_dump=True)
    assert old.method["variant"] == "paper"
    assert old.train.loss == "dice" and old.train.grad_clamp is None
    assert old.model["decoder_init"] == "kaiming"
    assert old.train.keep_optimizer_state and old.method["aggregation"] == "uniform"
    with pytest.raises(ConfigError, match=r"train\.loss: 'dice_foreground'"):
        load_config(path)
    path.write_text(dump_config(cfg))  # today's dump keeps its variant
    assert load_config(path, run_dump=True).method["variant"] == "authors"
