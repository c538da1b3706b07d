from pathlib import Path

import pytest

from fedseg.config import load_config, parse_config
from fedseg.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_valid_config_and_overrides(tmp_path):
    p = _write(tmp_path, "data: {root: d}\nmethod: {name: fedavg}\ntrain: {rounds: 3}\n")
    cfg = load_config(p, ["train.rounds=5", "train.lr=0.01", "data.labels=weak"])
    assert cfg.train.rounds == 5 and cfg.train.lr == 0.01 and cfg.data.labels == "weak"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data: {root: d}\ntrain: {roundz: 3}\n", "run.yaml: train.roundz: unknown key"),
        (
            "data: {root: d}\ntrain: {rounds: many}\n",
            "train.rounds: Input should be a valid integer",
        ),
        (
            "data: {root: d}\nmethod: {name: fedavgg}\n",
            "unknown method 'fedavgg'. Did you mean fedavg",
        ),
        ("method: {name: fedavg}\n", "data: Field required"),
        ("data: {root: d, labels: scribble}\n", "data.labels"),
        ("data: {root: d}\nmethod: {name: fedavg, mu: 1}\n", "mu"),
    ],
)
def test_invalid_configs_name_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(_write(tmp_path, text))


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.yaml is neither a file nor a shipped config"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"fedseg configs list"):
        load_config("no-such-config")
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(_write(tmp_path, "data: {root: d}\n"), ["train.rounds"])
    with pytest.raises(ConfigError, match="top level"):
        parse_config(["a"])  # type: ignore[arg-type]


def test_engine_backend_is_checked_when_the_config_loads():
    base = {"data": {"root": "d"}, "method": {"name": "fedavg"}}
    with pytest.raises(ConfigError, match=r"engine.backend: cpus: Input should be greater"):
        parse_config({**base, "engine": {"backend": {"name": "flower-sim", "cpus": -1}}})
    with pytest.raises(ConfigError, match=r"engine.backend: unknown backend 'nope'"):
        parse_config({**base, "engine": {"backend": "nope"}})
    cfg = parse_config({**base, "engine": {"backend": {"name": "flower-sim", "gpus": 0.5}}})
    assert cfg.engine.backend == {"name": "flower-sim", "gpus": 0.5}


@pytest.mark.parametrize(
    "method",
    [
        {"name": "ft"},
        {"name": "fedlc", "personal_iters": 3},
        {"name": "fedvc", "virtual_classes": 4},
        {"name": "fedrep", "head_iters": 2},
    ],
)
def test_a_run_config_holds_every_method_setting_and_its_dump_parses_again(method):
    import yaml

    from fedseg.config import dump_config, method_config

    cfg = parse_config({"data": {"root": "d"}, "method": method})
    defaults = method_config({"name": method["name"]}).model_dump(mode="json")
    given = {k for k in method if k != "name"}
    replaces = method_config(method).replaces
    replaced = {replaces[f] for f in given if f in replaces}  # personal_fraction, ...
    assert set(cfg.method) == {"name"} | (set(defaults) | given) - replaced
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_a_kept_run_made_under_another_method_default_is_not_reused(tmp_path):
    """A run directory's config.yaml holds the method's defaults, so a default changed since
    (FT's ft_lr went from the base rate to the last round's) shows; a config written before
    the defaults were recorded holds only what was set and is compared as it reads now."""
    import json

    from fedseg.config import dump_config
    from fedseg.reproduce.runs import finished_run

    cfg = parse_config({"data": {"root": "d"}, "method": {"name": "ft"}})
    run = tmp_path / "run"
    run.mkdir()
    dsc = {"dsc": {"fg": 0.5}}
    (run / "results.json").write_text(
        json.dumps({"precision": {}, "sites": {"A": dsc}, "average": dsc})
    )
    (run / "cases.csv").write_text("site,case\n")
    cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"amp": "off"})})
    (run / "config.yaml").write_text(dump_config(cfg))
    assert finished_run(run, cfg)
    old_default = dump_config(cfg).replace("ft_lr: last", "ft_lr: base")
    (run / "config.yaml").write_text(old_default)
    assert not finished_run(run, cfg)
    before_defaults_were_recorded = old_default.replace("  ft_lr: base\n", "")
    (run / "config.yaml").write_text(before_defaults_were_recorded)
    assert finished_run(run, cfg)


def test_switching_the_method_of_a_dumped_config_starts_from_the_new_methods_defaults():
    """A run's config.yaml records every method setting; ``--set method.name=...`` on it (the
    demo's 'another method on the same data') drops those at the old method's defaults and
    keeps the ones given other values, which must then fit the new method."""
    import yaml

    from fedseg.config import apply_overrides, dump_config

    def dumped(method: dict) -> dict:
        return yaml.safe_load(dump_config(parse_config({"data": {"root": "d"}, "method": method})))

    switched = apply_overrides(dumped({"name": "fedavg"}), ["method.name=fedlppa"])
    assert switched["method"] == {"name": "fedlppa"}
    assert (
        parse_config(switched).method
        == parse_config({"data": {"root": "d"}, "method": {"name": "fedlppa"}}).method
    )
    # the dump's train settings at FedAvg's defaults give way to FedLPPA's variant
    assert parse_config(switched).train.weight_decay == 0.01
    back = apply_overrides(
        yaml.safe_load(dump_config(parse_config(switched))), ["method.name=fedavg"]
    )
    assert parse_config(back).train.weight_decay == 1e-4
    kept = apply_overrides(dumped({"name": "fedprox", "mu": 0.5}), ["method.name=fedavg"])
    assert kept["method"] == {"name": "fedavg", "mu": 0.5}
    with pytest.raises(ConfigError, match=r"method\.mu: unknown key"):
        parse_config(kept)
    then_set = apply_overrides(dumped({"name": "fedavg"}), ["method.name=fedprox", "method.mu=0.1"])
    assert parse_config(then_set).method["mu"] == 0.1


def test_an_override_of_one_alternative_drops_the_other_recorded_in_a_dump(tmp_path):
    """A run's config.yaml records the alternative in force (``head_epochs: 1``,
    ``local_iters: 10``); ``--set`` of its rival replaces it instead of being refused."""
    from fedseg.config import dump_config, load_config

    cfg = parse_config({"data": {"root": "d"}, "method": {"name": "fedrep"}})
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    loaded = load_config(path, ["method.head_iters=8", "train.local_epochs=1"], run_dump=True)
    assert loaded.method["head_iters"] == 8 and loaded.train.local_epochs == 1
    assert loaded.train.local_iters is None or "local_iters" not in loaded.train.model_fields_set
    back = load_config(path, ["method.head_epochs=3"], run_dump=True)
    assert back.method["head_epochs"] == 3 and back.method["head_iters"] is None
    with pytest.raises(ConfigError, match="head_epochs or head_iters, not both"):
        parse_config(
            {"data": {"root": "d"}, "method": {"name": "fedrep", "head_iters": 8, "head_epochs": 2}}
        )
