"""Named intermediate features of any network, for prototype and contrastive methods.

A network that defines ``forward_features(x)`` returning an object with ``logits`` and a
``features`` mapping (as :class:`~fedseg.models.unet.UNetOutput`) is used as is; for any other
network the features are taken by forward hooks on the named sub-modules, so no method
re-implements hooks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedseg.errors import ConfigError

__all__ = ["feature_names", "named_features"]


def feature_names(model: nn.Module, x: torch.Tensor) -> list[str]:
    """The feature names ``model.forward_features`` provides for inputs like ``x``."""
    if not hasattr(model, "forward_features"):
        return []
    with torch.no_grad():
        return list(model.forward_features(x).features)


def named_features(
    model: nn.Module, x: torch.Tensor, names: Sequence[str] | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(logits, {name: feature})`` of one forward pass.

    ``names`` selects features; for a network with ``forward_features`` they are its feature
    names (default: all), otherwise qualified sub-module names whose outputs are captured.
    Raises ConfigError for an unknown name.
    """
    if hasattr(model, "forward_features"):
        out = model.forward_features(x)
        feats = dict(out.features)
        chosen = list(names) if names is not None else list(feats)
        unknown = [n for n in chosen if n not in feats]
        if unknown:
            raise ConfigError(
                f"{type(model).__name__} has no features {unknown}; it has {list(feats)}"
            )
        return out.logits, {n: feats[n] for n in chosen}
    modules = dict(model.named_modules())
    unknown = [n for n in names or () if n not in modules]
    if unknown or not names:
        raise ConfigError(
            f"{type(model).__name__} has no forward_features; name its sub-modules, e.g. "
            f"{[n for n in modules if n][:4]} (unknown: {unknown})"
        )
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        modules[n].register_forward_hook(
            lambda _m, _i, out, n=n: captured.__setitem__(n, out)  # type: ignore[misc]
        )
        for n in names
    ]
    try:
        logits = model(x)
    finally:
        for h in hooks:
            h.remove()
    return logits, {n: captured[n] for n in names}
