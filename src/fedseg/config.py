"""Run configuration: YAML files validated with pydantic, errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from fedseg.backends import sim_settings
from fedseg.configs import resolve_config
from fedseg.errors import ConfigError, RegistryError
from fedseg.methods import MethodConfig, TrainSettings, get_method
from fedseg.methods.variants import outdated_variant, variant_model, variant_train
from fedseg.models import ModelConfig, parse_model
from fedseg.privacy.settings import PrivacySettings

__all__ = [
    "DataSettings",
    "EngineSettings",
    "EvalSettings",
    "RunConfig",
    "ScreeningSettings",
    "SynthSettings",
    "TrackingSettings",
    "apply_overrides",
    "load_config",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SynthSettings(_Strict):
    """Synthesize the federation into ``data.root`` when it does not exist yet."""

    task: str
    sites: int | None = None
    size: int = 64
    per_site: int | None = None
    site_weights: list[PositiveFloat] | None = None
    """Relative site sizes (e.g. a paper's image counts); default: the task's imbalance."""
    names: Literal["letters", "paper"] = "letters"
    """Site names: A, B, ... or the simulated datasets' names (e.g. RUNMC, BMC, ...)."""
    weak_labels: bool = True
    """Also generate weak labels (with the task's default per-site annotation types)."""
    style_shift: float = Field(1.0, ge=0)
    """How far each site's appearance lies from the mean site: 1 the task's styles as
    designed, 0 identical sites, in between each style number moved linearly towards its
    mean over the task's sites (docs/data.md, "Site shift")."""
    split: tuple[float, float, float] = (0.7, 0.1, 0.2)
    """Train/validation/test fractions of every site (e.g. a larger validation share so that
    the smallest sites hold several validation cases)."""
    seed: int = 0
    """Seed of the federation's images, splits and weak labels; apart from the run's
    ``seed``, so every run of a config, whatever its seed, trains and tests on the same
    images (docs/data.md, "Synthetic federations in a run config")."""


class DataSettings(_Strict):
    root: Path
    """Federation folder (see docs/data.md)."""
    labels: Literal["weak", "full"] = "full"
    """Train on the sites' weak labels or on full masks."""
    sites: list[str] | None = None
    """Subset of sites to use (default: all)."""
    lazy: bool = False
    """Read a site's samples from the folder each time it trains or is evaluated and drop
    them after, so the engine holds one site's data at a time (for federations that do not
    fit in memory; costs a re-read per site and round). Centralized training pools every
    site and holds them all."""
    synth: SynthSettings | None = None


class EvalSettings(_Strict):
    every: int = Field(0, ge=0)
    """Also evaluate every N rounds (0: only at the end). Unset in a run config: every
    ``max(1, rounds // 4)`` rounds, i.e. three evaluations during a run of 4+ rounds."""
    batch_size: PositiveInt = 16
    split: Literal["test", "val"] = "test"
    periodic_split: Literal["val", "test"] = "val"
    """Split the periodic evaluation (``every``) scores: the validation split with full masks
    (sites without one are left out of that record), or ``test``."""
    save_models: bool = True
    """After an in-process run, export every site's evaluation model (and the global model)
    to ``RUN/models/<site>.pt`` with the config and label map (see docs/predict.md)."""


_SWITCH = {"false": "off", "no": "off", "off": "off", "true": "auto", "yes": "auto", "on": "auto"}
"""What a user may type for a switch (``engine.amp``, ``engine.channels_last``)."""


class EngineSettings(_Strict):
    name: Literal["inprocess"] = "inprocess"
    device: str = Field("auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    checkpoint_every: int = Field(1, ge=1)
    """Write the resumable checkpoint every N rounds (the last round always)."""
    amp: Literal["off", "auto", "bf16", "fp16"] = "auto"
    """Mixed precision for training and evaluation forwards: ``bf16`` or ``fp16`` autocast
    (``fp16`` with a gradient scaler, CUDA only; ``bf16`` also on CPU); ``auto`` (default):
    ``bf16`` where the device computes it natively and the network and method were shown to
    train alike in it over 3 seeds (2D networks; docs/benchmarks_speed.md), else off.
    ``false``/``true`` mean off/auto."""
    channels_last: Literal["auto"] | bool = "auto"
    """Run convolutions in channels-last memory format (model and inputs); ``auto``: where
    measured faster for the network (2D networks; docs/benchmarks_speed.md)."""
    threads: int = Field(0, ge=0)
    """CPU threads for torch (0: torch's default). Use 1 when other jobs share the CPU:
    oversubscribed threads slow training down many times over."""
    workers: int = Field(1, ge=1)
    """Processes that train (and evaluate) the sites of a round in parallel with the
    in-process engine (1: one after another). Results are identical to ``workers: 1`` at the
    same torch threads per process; ``threads`` (0: torch's default divided by ``workers``)
    is per worker process."""
    site_states: Literal["memory", "disk"] = "memory"
    """Where the in-process engine keeps each site's private state between rounds: in
    ``memory`` (in the checkpoint too), or on ``disk`` in ``RUN/sites/<site>/<run id>/`` (the
    state before round 1 and the newest ``checkpoint_every + 1`` rounds, read when the site
    trains or is evaluated; the checkpoint records which round each file holds), for
    federations whose private states do not fit in memory; with ``workers`` the worker
    processes read and write the files. Results are identical."""
    backend: str | dict[str, Any] = "inprocess"
    """Where the sites run: ``inprocess`` (default: one process, sites one after another) or
    ``flower-sim`` (Flower's Ray-based simulation engine, sites in parallel), or a mapping
    with per-site resources, e.g. ``{name: flower-sim, cpus: 1, gpus: 0.25, ray_address:
    auto}`` (docs/deployment.md)."""

    @field_validator("amp", mode="before")
    @classmethod
    def _amp_words(cls, v: object) -> object:
        """YAML and ``--set`` read ``off``/``on`` as booleans: take them as the user means."""
        if isinstance(v, bool):
            return "auto" if v else "off"
        if isinstance(v, str):
            word = v.lower()
            return _SWITCH.get(word, word)
        return v

    @field_validator("channels_last", mode="before")
    @classmethod
    def _layout_words(cls, v: object) -> object:
        if isinstance(v, bool) or v == "auto":
            return v
        word = _SWITCH.get(str(v).lower())
        if word is None:
            raise ValueError("expected auto, true or false")  # the error shows what it got
        return word == "auto"

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        try:
            sim_settings(v)
        except ConfigError as e:
            raise ValueError(
                e.reason.removeprefix("engine.backend: ").removeprefix("engine.backend.")
            ) from None
        return v


class TrackingSettings(_Strict):
    """Live logging of every round (``fedseg.tracking``; docs/config.md#tracking)."""

    tensorboard: bool = False
    """TensorBoard event files in ``<run dir>/tensorboard`` (needs ``tensorboard``)."""
    mlflow: bool = False
    """MLflow metrics per round (needs ``mlflow``; ``MLFLOW_TRACKING_URI`` picks the server)."""


class ScreeningSettings(_Strict):
    """Optional bounds against sites that lie (docs/deployment.md#security); unset: off."""

    max_samples_ratio: float | None = Field(None, ge=1)
    """Refuse the run when a site declares more than this many times the median declared
    training-sample count of the federation (the lower median with an even number)."""
    max_update_norm_ratio: float | None = Field(None, ge=1)
    """Refuse, for the round, an upload whose update (its distance from the payload the
    site was sent) has an L2 norm above this many times the round's median update norm;
    the round's uploads are then held until all arrived."""


class RunConfig(_Strict):
    """A whole run: data, method, training, evaluation and engine settings."""

    name: str = "run"
    seed: int = 0
    data: DataSettings
    method: dict[str, Any] = Field(
        default_factory=lambda: {"name": "fedavg"}, validate_default=True
    )
    model: dict[str, Any] = Field(default_factory=lambda: {"name": "unet"}, validate_default=True)
    """The network (``fedseg.models``): ``name`` plus its options, e.g. ``widths``, ``norm``."""
    train: TrainSettings = TrainSettings()
    eval: EvalSettings = EvalSettings()
    engine: EngineSettings = EngineSettings()
    tracking: TrackingSettings = TrackingSettings()
    privacy: PrivacySettings = PrivacySettings()
    """Differential privacy of the released model (docs/privacy.md)."""
    screening: ScreeningSettings = ScreeningSettings()
    """Bounds on declared sample counts and update norms (off by default)."""

    @model_validator(mode="before")
    @classmethod
    def _default_eval_every(cls, data: Any) -> Any:
        """Periodic evaluation on by default: ``eval.every`` unset -> ``max(1, rounds // 4)``."""
        if not isinstance(data, dict) or not isinstance(data.get("eval") or {}, dict):
            return data
        ev, train = dict(data.get("eval") or {}), data.get("train") or {}
        default = TrainSettings.model_fields["rounds"].default
        rounds = train.get("rounds", default) if isinstance(train, dict) else train.rounds
        if "every" in ev or not isinstance(rounds, int) or rounds < 1:
            return data  # set explicitly, or the rounds field reports its own error
        return {**data, "eval": {**ev, "every": max(1, rounds // 4)}}

    @model_validator(mode="before")
    @classmethod
    def _variant_blocks(cls, data: Any) -> Any:
        """``method.variant`` also fixes ``train:`` and ``model:`` settings
        (fedseg.methods.variants)."""
        if not isinstance(data, dict):
            return data
        method = data.get("method")
        train = variant_train(method, data.get("train"))
        model = variant_model(method, data.get("model"))
        changed = {k: v for k, v in (("train", train), ("model", model)) if v is not data.get(k)}
        return {**data, **changed} if changed else data

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "name" not in v:
            raise ValueError("needs a 'name' (see `fedseg methods`)")
        return resolved_method(v)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            return parse_model(v).model_dump()
        except ConfigError as e:
            raise ValueError(e.reason.removeprefix("model.").removeprefix("model: ")) from None

    @model_validator(mode="after")
    def _private_method(self) -> RunConfig:
        from fedseg.privacy.select import require_supported

        if self.privacy.enabled:
            try:
                require_supported(self.privacy, self.method_name, get_method(self.method_name))
            except ConfigError as e:
                raise ValueError(e.reason) from None
        if self.privacy.mode == "local" and self.train.grad_clamp is not None:
            raise ValueError(
                "train.grad_clamp: not with privacy.mode local, whose DP-SGD clips each "
                "example's gradient (privacy.clip); unset it"
            )
        return self

    @property
    def method_name(self) -> str:
        return str(self.method["name"])

    @property
    def model_settings(self) -> ModelConfig:
        return parse_model(self.model)


def method_config(block: dict[str, Any]) -> MethodConfig:
    """Validate a ``method:`` block against the named method's own settings."""
    try:
        cls = get_method(str(block["name"]))
    except RegistryError as e:
        raise ValueError(e.reason) from None
    return cls.Config(**{k: v for k, v in block.items() if k != "name"})


def resolved_method(block: dict[str, Any]) -> dict[str, Any]:
    """A ``method:`` block with every setting of the named method, defaults filled in (what
    :class:`RunConfig` holds, so ``config.yaml`` shows a later change of a default)."""
    return {"name": block["name"], **method_config(block).model_dump(mode="json")}


def _format(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = ".".join(str(p) for p in e["loc"]) or _named_field(msg) or "<root>"
        msg = msg.removeprefix(f"{loc}: ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {got!r})"
        lines.append(f"{source}: {loc}: {msg}{shown}")
    return "\n".join(lines)


def _named_field(msg: str) -> str | None:
    """The dotted field a whole-config check's message opens with (``train.grad_clamp: ...``)."""
    head, sep, _ = msg.partition(": ")
    return head if sep and re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", head) else None


def parse_config(raw: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a raw mapping; raise :class:`ConfigError` naming every bad field."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(raw).__name__}"
        )
    try:
        return RunConfig(**raw)
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config mapping.

    An override of one of two alternative settings (``train.local_epochs`` and
    ``local_iters``, FedRep's ``head_iters`` and ``head_epochs``) drops the other from the
    block, as a run's ``config.yaml`` records the one in force. ``method.name`` set to
    another method drops the block's settings that equal the old
    method's defaults (a run's ``config.yaml`` records them all), and the ``train:``
    settings that equal the old method's (its variant's, or the global defaults), so the new
    method starts from its own defaults; settings given other values are kept (and must fit
    it)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.rounds=5")
        key, value = item.split("=", 1)
        node = raw
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p} is not a mapping")
        new = yaml.safe_load(value)
        if parents == ["method"] and leaf == "name" and node.get("name") != new:
            if isinstance(raw.get("train"), dict):
                raw["train"] = _train_without_defaults(raw["train"], node)
            node = _without_defaults(node)
            raw["method"] = node
        rival = _rivals(raw, parents).get(leaf)
        if rival is not None and new is not None:
            node.pop(rival, None)  # the override is the later word
        node[leaf] = new
    return raw


def _rivals(raw: dict[str, Any], parents: list[str]) -> dict[str, str]:
    """The block's pairs of alternative settings (``train.local_iters`` / ``local_epochs``,
    FedRep's ``head_epochs`` / ``head_iters``), each mapped to the other."""
    if parents == ["train"]:
        replaces = TrainSettings.replaces
    elif parents == ["method"] and isinstance(raw.get("method"), dict):
        config = _config_class(raw["method"])
        replaces = config.replaces if config is not None else {}
    else:
        return {}
    return {**replaces, **{v: k for k, v in replaces.items()}}


def _without_defaults(block: dict[str, Any]) -> dict[str, Any]:
    """``block`` without the settings that equal its method's defaults (the whole block as
    it is where the method is unknown)."""
    try:
        defaults = method_config({"name": block["name"]}).model_dump(mode="json")
    except (KeyError, ValueError):
        return block
    return {k: v for k, v in block.items() if k not in defaults or defaults[k] != v}


def _train_without_defaults(train: dict[str, Any], method: dict[str, Any]) -> dict[str, Any]:
    """``train`` without the settings that equal what ``method``'s block gets by default
    (its variant's ``train:`` settings, else the global defaults)."""
    try:
        defaults = TrainSettings(**variant_train({"name": method.get("name")}, {}))
    except (TypeError, ValueError):
        return train
    dumped = defaults.model_dump(mode="json")
    return {k: v for k, v in train.items() if k not in dumped or dumped[k] != v}


def _config_class(block: dict[str, Any]) -> type[MethodConfig] | None:
    """The settings class of the ``method:`` block's method (``None`` if unknown)."""
    try:
        return get_method(str(block.get("name"))).Config
    except RegistryError:
        return None


def _has_variants(block: dict[str, Any]) -> bool:
    """Whether the ``method:`` block's method has named variants (``method.variant``)."""
    config = _config_class(block)
    return config is not None and "variant" in config.model_fields


PVTV2_FPN_BEFORE = {"decoder_init": "kaiming", "upsample": "logits"}
"""What a ``pvtv2_fpn`` network did before these settings existed (their defaults since
2026-12-05 are FedDP's code, docs/methods/pvtv2_fpn.md)."""


def from_run_dump(raw: dict[str, Any]) -> dict[str, Any]:
    """A run directory's ``config.yaml`` as :func:`parse_config` takes it and as a dump
    written today reads. Dumps written before 2026-11-25 also hold the inactive
    ``train.local_iters`` beside ``train.local_epochs``, which a config written by hand may
    not; those before 2026-11-28 hold only the method settings given (today's defaults are
    filled in; an invalid block is left as it is); those before 2026-11-29 have no
    ``data.synth.seed`` (its default is filled in; which federation such a run used is what
    ``benchmarks/data_seed_audit.py`` establishes); those before 2026-12-01 have no
    ``screening`` block (its defaults, off, are filled in) and no ``method.variant``: they
    ran the paper reading, ``variant: paper`` (FedLPPA's default is ``authors`` since
    2026-12-03); a ``pvtv2_fpn`` block without ``decoder_init`` or ``upsample`` (before
    2026-12-05) ran :data:`PVTV2_FPN_BEFORE`. A dump whose recorded settings conflict with
    what its variant fixes today (FedDP's ``authors`` gained four on 2026-12-05) reads as
    ``variant: paper`` with the settings it ran."""
    if "screening" not in raw:
        raw = {**raw, "screening": ScreeningSettings().model_dump()}
    model = raw.get("model")
    if isinstance(model, dict) and model.get("name") == "pvtv2_fpn":
        raw = {**raw, "model": {**PVTV2_FPN_BEFORE, **model}}
    method = raw.get("method")
    if isinstance(method, dict) and "variant" not in method and _has_variants(method):
        raw = {**raw, "method": {**method, "variant": "paper"}}
    elif isinstance(method, dict):
        plain = outdated_variant(method, raw.get("train"), raw.get("model"))
        if plain is not None:
            raw = {**raw, "method": {**method, "variant": plain}}
    train = raw.get("train")
    if isinstance(train, dict) and train.get("local_epochs") is not None:
        raw = {**raw, "train": {k: v for k, v in train.items() if k != "local_iters"}}
    data = raw.get("data")
    synth = data.get("synth") if isinstance(data, dict) else None
    if isinstance(synth, dict) and "seed" not in synth:
        seed = SynthSettings.model_fields["seed"].default
        raw = {**raw, "data": {**data, "synth": {**synth, "seed": seed}}}
    try:
        return {**raw, "method": resolved_method(raw["method"])}
    except (KeyError, TypeError, ValueError):
        return raw


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, run_dump: bool = False
) -> RunConfig:
    """Read, override and validate a YAML run configuration (a file or a shipped name;
    ``run_dump``: a run directory's ``config.yaml``, see :func:`from_run_dump`).

    Relative ``data.root`` paths are taken relative to the current directory.
    """
    path = resolve_config(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if run_dump and isinstance(raw, dict):
        raw = from_run_dump(raw)
    return parse_config(apply_overrides(raw, overrides or []), str(path))


def dump_config(cfg: RunConfig) -> str:
    """The resolved configuration as YAML (what ``config.yaml`` in a run directory holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
