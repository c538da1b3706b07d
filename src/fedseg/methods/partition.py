"""Which state-dict entries are shared, downloaded only, or private: declared once, by name."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from fedseg.errors import ConfigError

__all__ = ["Partition", "ResolvedPartition", "Selector", "modules_of_type"]

Selector = str | Callable[[nn.Module], Iterable[str]]
"""A shell-style pattern over state-dict keys, or a function of the model returning keys."""


def modules_of_type(*types: type[nn.Module]) -> Callable[[nn.Module], list[str]]:
    """Selector of every state-dict key (parameters and buffers) of modules of ``types``.

    BatchNorm layers must be found this way: their names in fedseg's UNet contain no "bn".
    """

    def select(model: nn.Module) -> list[str]:
        keys = []
        for prefix, module in model.named_modules():
            if isinstance(module, types):
                keys += [f"{prefix}.{k}" if prefix else k for k in module.state_dict()]
        return keys

    select.__name__ = f"modules_of_type({', '.join(t.__name__ for t in types)})"
    return select


@dataclass(frozen=True)
class Partition:
    """Roles of the model's state-dict entries.

    Precedence: ``private`` > ``download_only`` > ``shared``. Every key must get a role, and
    every selector must match at least one key. A network may keep entries on the site
    whatever the method: patterns in its ``private_keys`` attribute join ``private`` (e.g.
    SynergyNet's codebook with ``codebook: private``).

    Attributes:
        shared: uploaded by a site and sent back by the server.
        download_only: sent by the server, never uploaded (e.g. FedLPPA's auxiliary decoder).
        private: never leaves the site (personal layers, BN statistics under FedBN).
    """

    shared: tuple[Selector, ...] = ("*",)
    download_only: tuple[Selector, ...] = ()
    private: tuple[Selector, ...] = ()

    def resolve(self, model: nn.Module) -> ResolvedPartition:
        """Assign every state-dict key of ``model`` to exactly one role."""
        keys = list(model.state_dict())
        groups = {}
        own: tuple[Selector, ...] = tuple(getattr(model, "private_keys", ()))
        for role in ("private", "download_only", "shared"):
            matched: set[str] = set()
            for sel in getattr(self, role) + (own if role == "private" else ()):
                hits = _match(sel, keys, model)
                if not hits:
                    raise ConfigError(
                        f"partition.{role} selector {_describe(sel)} matches no model key; "
                        f"example keys: {', '.join(keys[:3])}, ..., {keys[-1]}"
                    )
                matched |= hits
            groups[role] = matched - set().union(*groups.values()) if groups else matched
        missing = [k for k in keys if not any(k in g for g in groups.values())]
        if missing:
            raise ConfigError(
                f"partition gives no role to {len(missing)} model keys, e.g. {missing[:3]}"
            )
        order = {k: i for i, k in enumerate(keys)}
        ordered = {r: tuple(sorted(g, key=order.__getitem__)) for r, g in groups.items()}
        trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
        return ResolvedPartition(
            shared=ordered["shared"],
            download_only=ordered["download_only"],
            private=ordered["private"],
            trainable=trainable,
        )


def _match(sel: Selector, keys: list[str], model: nn.Module) -> set[str]:
    if isinstance(sel, str):
        return {k for k in keys if fnmatch.fnmatchcase(k, sel)}
    found = set(sel(model))
    unknown = found - set(keys)
    if unknown:
        raise ConfigError(f"selector {_describe(sel)} returned unknown keys {sorted(unknown)[:3]}")
    return found


def _describe(sel: Selector) -> str:
    return repr(sel) if isinstance(sel, str) else getattr(sel, "__name__", repr(sel))


@dataclass(frozen=True)
class ResolvedPartition:
    """Key tuples per role (in state-dict order) and the trainable size of every parameter."""

    shared: tuple[str, ...]
    download_only: tuple[str, ...]
    private: tuple[str, ...]
    trainable: dict[str, int] = field(repr=False)

    @property
    def upload(self) -> tuple[str, ...]:
        return self.shared

    @property
    def download(self) -> tuple[str, ...]:
        return self.shared + self.download_only

    def count(self, keys: Iterable[str]) -> int:
        """Trainable parameters among ``keys`` (buffers such as BN statistics count 0)."""
        return sum(self.trainable.get(k, 0) for k in keys)

    def params(self) -> dict[str, int]:
        """``{"total", "upload", "download"}`` parameter counts per client per round."""
        return {
            "total": sum(self.trainable.values()),
            "upload": self.count(self.upload),
            "download": self.count(self.download),
        }

    @staticmethod
    def take(state: dict[str, torch.Tensor], keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """Detached copies of ``state[k]`` for ``keys``."""
        return {k: state[k].detach().clone() for k in keys}
