"""Named variants of a method: ``method.variant`` fixes a set of method and ``train:``
settings at once (``authors``: what the authors' public code does, its defects excepted).

The variant's settings are filled in when the config is loaded, so the run's
``config.yaml`` records every one of them. A setting given explicitly with another value
is never overridden: the config is refused, naming the variant's value and the given one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, TypeAdapter, ValidationError, model_validator

from fedseg.errors import RegistryError
from fedseg.methods.base import MethodConfig, TrainSettings
from fedseg.methods.registry import get_method

__all__ = ["Variant", "VariantConfig", "conflicts", "variant_train"]


@dataclass(frozen=True)
class Variant:
    """The settings one named variant fixes, and where each behaviour comes from."""

    method: Mapping[str, Any] = field(default_factory=dict)
    """Method settings (the ``method:`` block)."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """``train:`` settings."""


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


def _refuse(variant: str, found: list[str]) -> None:
    if found:
        raise ValueError(
            f"method.variant {variant!r} sets "
            + "; ".join(found)
            + ": remove the config's setting, or use another variant"
        )


class VariantConfig(MethodConfig):
    """A method config with named variants: a subclass declares ``variant`` (a ``Literal``
    of the names, its default first) and ``variants`` (name -> :class:`Variant`; the
    default, which fixes nothing, is not listed)."""

    variants: ClassVar[Mapping[str, Variant]] = {}

    @model_validator(mode="before")
    @classmethod
    def _variant_settings(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("variant"), str):
            return data
        chosen = cls.variants.get(data["variant"])
        if chosen is None:
            return data  # the default, or an unknown name the variant field reports
        _refuse(data["variant"], conflicts(chosen.method, data, cls, "method"))
        return {**data, **chosen.method}


def variant_train(method: Any, train: Any) -> Any:
    """The ``train:`` block with the settings of the ``method:`` block's ``variant`` filled
    in (``train`` as given where the method or variant is unknown or fixes none: their own
    validation reports those). Raises ``ValueError`` naming every conflicting setting of
    both blocks."""
    if not isinstance(method, Mapping) or not isinstance(method.get("variant"), str):
        return train
    try:
        config = get_method(str(method.get("name"))).Config
    except RegistryError:
        return train
    variants = getattr(config, "variants", {})
    chosen = variants.get(method["variant"])
    if chosen is None or not chosen.train:
        return train
    if isinstance(train, TrainSettings):
        train = train.model_dump(exclude_unset=True)
    if not isinstance(train, Mapping | None):
        return train
    given = dict(train or {})
    found = conflicts(chosen.method, method, config, "method")
    _refuse(method["variant"], found + conflicts(chosen.train, given, TrainSettings, "train"))
    return {**given, **chosen.train}
