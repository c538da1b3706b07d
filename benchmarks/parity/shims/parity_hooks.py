"""Import hook shared by the parity shims (``shims/<code>/sitecustomize.py``): after a named
module of the other codebase is imported the normal way, a function patches names in it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["patch_after_import"]


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, patches: Mapping[str, Callable[[types.ModuleType], None]]) -> None:
        self.patches = dict(patches)
        self.inner: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None:
            return None
        self.inner[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner[spec.name].create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner[module.__name__].exec_module(module)
        self.patches[module.__name__](module)


def patch_after_import(patches: Mapping[str, Callable[[types.ModuleType], None]]) -> None:
    """Call ``patches[name](module)`` right after ``name`` is first imported."""
    sys.meta_path.insert(0, _PatchAfterImport(patches))
