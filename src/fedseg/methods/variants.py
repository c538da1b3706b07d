"""Named variants of a method: ``method.variant`` fixes a set of method, ``train:`` and
``model:`` settings at once (``authors``: what the authors' public code does, its defects excepted).

The variant's settings are filled in when the config is loaded, so the run's
``config.yaml`` records every one of them. A setting given explicitly with another value
is never overridden: the config is refused, naming the variant's value and the given one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError, model_validator

from fedseg.errors import RegistryError
from fedseg.methods.base import MethodConfig, TrainSettings
from fedseg.methods.registry import get_method
from fedseg.models.registry import get_model

__all__ = [
    "Variant",
    "VariantConfig",
    "conflicts",
    "outdated_variant",
    "variant_model",
    "variant_train",
]


@dataclass(frozen=True)
class Variant:
    """The settings one named variant fixes, and where each behaviour comes from."""

    method: Mapping[str, Any] = field(default_factory=dict)
    """Method settings (the ``method:`` block); another value given for one is refused."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """``train:`` settings, fixed as ``method``."""
    model: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """``model:`` settings per model name, fixed as ``method`` where the model block names
    that model."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Method settings filled in where the config gives none; a given value is kept (a
    schedule tied to the run's budget, e.g. a warm-up in rounds)."""


def _same(model: type[BaseModel], key: str, given: Any, fixed: Any) -> bool:
    """Whether ``given`` (as a user typed it, e.g. the YAML string ``1e-2``) is ``fixed``."""
    if given == fixed:
        return True
    try:
        return bool(TypeAdapter(model.model_fields[key].annotation).validate_python(given) == fixed)
    except (KeyError, ValidationError):
        return False


def conflicts(
    fixed: Mapping[str, Any], given: Mapping[str, Any], model: type[BaseModel], where: str
) -> list[str]:
    """The given settings of ``where`` (``method`` or ``train``) that differ from the
    ``fixed`` ones, including an alternative that replaces one of them
    (``train.local_iters`` against a fixed ``train.local_epochs``)."""
    replaces = getattr(model, "replaces", {})
    rivals = {**replaces, **{v: k for k, v in replaces.items()}}
    out = []
    for key, value in fixed.items():
        if key in given and not _same(model, key, given[key], value):
            out.append(f"{where}.{key}: {value!r} (the config sets {given[key]!r})")
        rival = rivals.get(key)
        if rival not in fixed and given.get(rival) is not None:
            out.append(f"{where}.{key}: {value!r} (the config sets {where}.{rival})")
    return out


def _refuse(config: type[BaseModel], variant: str, found: list[str]) -> None:
    if found:
        names = get_args(config.model_fields["variant"].annotation)
        others = " or ".join(repr(n) for n in names if n != variant)
        raise ValueError(
            f"method.variant {variant!r} sets "
            + "; ".join(found)
            + f": remove the config's setting, or set method.variant to {others}"
        )


def _chosen(config: type[BaseModel], block: Mapping[str, Any]) -> tuple[str, Variant | None]:
    """The variant a ``method:`` block names (the field's default where it names none) and
    its :class:`Variant` (``None`` for a variant that sets nothing, or an unknown name)."""
    name = block.get("variant", config.model_fields["variant"].default)
    if not isinstance(name, str):
        return "", None
    return name, getattr(config, "variants", {}).get(name)


class VariantConfig(MethodConfig):
    """A method config with named variants: a subclass declares ``variant`` (a ``Literal``
    of the names and its default) and ``variants`` (name -> :class:`Variant`; a variant
    that sets nothing, the paper reading where that is the default, need not be listed).
    The default variant's settings are filled in when the config names no variant."""

    variants: ClassVar[Mapping[str, Variant]] = {}

    @model_validator(mode="before")
    @classmethod
    def _variant_settings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name, chosen = _chosen(cls, data)
        if chosen is None:
            return data  # a variant that sets nothing, or an unknown name the field reports
        _refuse(cls, name, conflicts(chosen.method, data, cls, "method"))
        return {**chosen.defaults, **data, **chosen.method}


def _variant_of(method: Any) -> tuple[type[BaseModel], str, Variant] | None:
    """The method's settings class, variant name and :class:`Variant` a ``method:`` block
    chooses (``None`` where the method or variant is unknown or the variant sets nothing:
    their own validation reports those)."""
    if not isinstance(method, Mapping):
        return None
    try:
        config = get_method(str(method.get("name"))).Config
    except RegistryError:
        return None
    if "variant" not in config.model_fields:
        return None
    name, chosen = _chosen(config, method)
    return None if chosen is None else (config, name, chosen)


def variant_train(method: Any, train: Any) -> Any:
    """The ``train:`` block with the settings of the ``method:`` block's ``variant`` filled
    in (``train`` as given where the method or variant is unknown or fixes none). Raises
    ``ValueError`` naming every conflicting setting of both blocks."""
    found = _variant_of(method)
    if found is None or not found[2].train:
        return train
    config, name, chosen = found
    if isinstance(train, TrainSettings):
        train = train.model_dump(exclude_unset=True)
    if not isinstance(train, Mapping | None):
        return train
    given = dict(train or {})
    clashes = conflicts(chosen.method, method, config, "method")
    _refuse(config, name, clashes + conflicts(chosen.train, given, TrainSettings, "train"))
    return {**given, **chosen.train}


def _model_settings(chosen: Variant, model: Any) -> tuple[Mapping[str, Any], list[str]]:
    """The settings ``chosen`` fixes for the model the ``model:`` block names, and the
    block's settings that conflict with them (none where it fixes none)."""
    if not isinstance(model, Mapping) or not chosen.model.get(str(model.get("name"))):
        return {}, []
    try:
        settings = get_model(str(model["name"]))
    except RegistryError:
        return {}, []
    fixed = chosen.model[str(model["name"])]
    return fixed, conflicts(fixed, model, settings, "model")


def variant_model(method: Any, model: Any) -> Any:
    """The ``model:`` block with the variant's settings for the model it names filled in
    (``model`` as given where none apply). Raises ``ValueError`` naming a conflicting one."""
    found = _variant_of(method)
    if found is None:
        return model
    config, name, chosen = found
    fixed, clashes = _model_settings(chosen, model)
    if not fixed:
        return model
    _refuse(config, name, clashes)
    return {**model, **fixed}


def outdated_variant(method: Any, train: Any, model: Any) -> str | None:
    """For a run's ``config.yaml``, which records every setting it ran with: the variant that
    fixes nothing (``paper``), where a setting it recorded conflicts with what its variant
    fixes today (the variant gained the setting since the run); ``None`` where none does."""
    found = _variant_of(method)
    if found is None:
        return None
    config, _, chosen = found
    clash = conflicts(chosen.method, method, config, "method") + _model_settings(chosen, model)[1]
    if isinstance(train, Mapping):
        clash += conflicts(chosen.train, train, TrainSettings, "train")
    if not clash:
        return None
    names = get_args(config.model_fields["variant"].annotation)
    return next(n for n in names if n not in config.variants)
