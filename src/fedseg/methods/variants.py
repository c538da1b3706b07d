"""Named variants of a method: ``method.variant`` fixes a set of method and ``train:``
settings at once (``authors``: what the authors' public code does, its defects excepted).

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

__all__ = ["Variant", "VariantConfig", "conflicts", "variant_train"]


@dataclass(frozen=True)
class Variant:
    """The settings one named variant fixes, and where each behaviour comes from."""

    method: Mapping[str, Any] = field(default_factory=dict)
    """Method settings (the ``method:`` block); another value given for one is refused."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """``train:`` settings, fixed as ``method``."""
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


def variant_train(method: Any, train: Any) -> Any:
    """The ``train:`` block with the settings of the ``method:`` block's ``variant`` filled
    in (``train`` as given where the method or variant is unknown or fixes none: their own
    validation reports those). Raises ``ValueError`` naming every conflicting setting of
    both blocks."""
    if not isinstance(method, Mapping):
        return train
    try:
        config = get_method(str(method.get("name"))).Config
    except RegistryError:
        return train
    if "variant" not in config.model_fields:
        return train
    name, chosen = _chosen(config, method)
    if chosen is None or not chosen.train:
        return train
    if isinstance(train, TrainSettings):
        train = train.model_dump(exclude_unset=True)
    if not isinstance(train, Mapping | None):
        return train
    given = dict(train or {})
    found = conflicts(chosen.method, method, config, "method")
    _refuse(config, name, found + conflicts(chosen.train, given, TrainSettings, "train"))
    return {**given, **chosen.train}
