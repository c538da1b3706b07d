"""The model registry: the YAML ``model:`` block names a network and sets its options.

A network registers its settings class with ``@register_model("name")``; the class validates
the block (unknown keys are errors) and builds the network for a task with :meth:`build`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from fedseg.errors import ConfigError, RegistryError
from fedseg.registry import Registry

__all__ = ["MODELS", "ModelConfig", "get_model", "list_models", "parse_model", "register_model"]


class ModelConfig(BaseModel):
    """Base of every network's settings (the YAML ``model:`` block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str

    def build(self, in_channels: int, num_classes: int, ndim: int) -> nn.Module:
        """The network for a task with ``in_channels`` inputs and ``num_classes`` outputs."""
        raise NotImplementedError

    def channels_last_faster(self, ndim: int) -> bool:
        """Whether ``engine.channels_last: auto`` puts this network in channels-last layout:
        2D networks train faster in it on CPU (docs/benchmarks_speed.md); 3D networks stay
        contiguous (docs/config.md, issue 29). A network measured otherwise overrides this."""
        return ndim == 2

    def bf16_auto(self, ndim: int) -> bool:
        """Whether ``engine.amp: auto`` may run this network in bf16 (where the hardware
        computes it natively): 2D convolutional networks, which train 1.3-1.8x faster in it
        and whose results moved less than their seed spread over 3 seeds
        (docs/benchmarks_speed.md); 3D networks stay float32 under ``auto`` (not compared
        over seeds; docs/config.md, issue 29). ``engine.amp: bf16`` forces it anywhere."""
        return ndim == 2


MODELS: Registry[type[ModelConfig]] = Registry("model")
register_model = MODELS.register


@cache
def _discover() -> None:
    """Import every module of :mod:`fedseg.models` so that each ``@register_model`` runs."""
    import fedseg.models as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def get_model(name: str) -> type[ModelConfig]:
    """The settings class registered as ``name`` (unknown names list close matches)."""
    _discover()
    return MODELS.get(name)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching ``pattern``."""
    _discover()
    return MODELS.names(pattern)


def parse_model(block: Mapping[str, Any] | ModelConfig | None) -> ModelConfig:
    """Validate a ``model:`` block (default: ``{"name": "unet"}``).

    Raises ConfigError naming the unknown model or the bad field."""
    if isinstance(block, ModelConfig):
        return block
    raw = dict(block or {})
    raw.setdefault("name", "unet")
    try:
        cls = get_model(str(raw["name"]))
    except RegistryError as e:
        raise ConfigError(f"model.name: {e.reason}") from None
    try:
        return cls(**raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = "".join(f".{p}" for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        got = "" if not first["loc"] else f" (got {first.get('input')!r})"
        raise ConfigError(f"model{loc}: {msg}{got}") from None
