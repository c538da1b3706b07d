"""A small generic name -> object registry filled by decorators."""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedseg.errors import RegistryError

__all__ = ["Registry"]

T = TypeVar("T")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Registry(Generic[T]):
    """Maps lower-case names to objects; duplicates and bad names raise.

    Example:
        >>> methods: Registry[type] = Registry("method")
        >>> @methods.register("fedavg")
        ... class FedAvg: ...
        >>> methods.get("fedavg") is FedAvg
        True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``."""
        if not _NAME.match(name):
            raise RegistryError(
                f"{self.kind} name {name!r} is invalid: use lower-case letters, digits and '_'"
            )

        def decorator(obj: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the object registered as ``name``; unknown names list close matches."""
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(sorted(self._items))}"
            ) from None

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching a shell-style ``pattern``."""
        return sorted(n for n in self._items if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
