"""Helpers shared by the parity shims (``shims/<code>/sitecustomize.py``): an import hook
that patches names in a module of the other codebase right after it is imported the normal
way, and the torchvision operator declarations the CUDA torchvision wheel needs here."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["declare_torchvision_ops", "patch_after_import"]

_LIBS: list[torch.library.Library] = []


def declare_torchvision_ops() -> None:
    """Declare the ``torchvision::nms`` and ``torchvision::qnms`` schemas (no kernels): the
    only torchvision wheel served here is a CUDA build, whose import registers kernels for
    them and fails beside the CPU torch when they are undeclared. Neither code calls nms."""
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBS.append(lib)  # kept alive: a dropped Library removes its definitions


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
