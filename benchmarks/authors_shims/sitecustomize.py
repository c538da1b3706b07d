"""Local shims that let the FedLPPA authors' code (llmir/FedLPPA, ``code_v4``) run on a CPU.

Loaded by ``benchmarks/authors_toy.py`` through ``PYTHONPATH`` (Python imports
``sitecustomize`` at start-up) into the authors' server and client processes only; their
files are run unmodified. What it does, and nothing else:

- ``Tensor.cuda()`` and ``Module.cuda()`` return the object itself (the CPU tensor/module):
  the authors' code calls ``.cuda()`` on models, batches and loss terms.
- Modules the authors' code imports but that are absent or unusable here become stubs that
  raise if the toy run ever used them (it does not):
  ``utils.TreeEnergyLoss.lib.*`` (not in their repository: their ``.gitignore`` drops
  ``lib/``), ``tree_filter_cuda`` (a CUDA-only extension) and ``torchvision`` (PyPI's build
  does not load beside the CPU torch). Two torchvision helpers the run does use get small
  equivalents: ``transforms.Compose`` (apply the transforms in order) and ``utils.make_grid``
  (tile images for the server's TensorBoard image).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import math
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


def _module_cuda(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
    return self


torch.Tensor.cuda = _tensor_cuda  # type: ignore[method-assign]
torch.nn.Module.cuda = _module_cuda  # type: ignore[method-assign]


def _unavailable(name: str) -> type:
    """A class that fails on use: the toy run never builds one."""

    def init(self: object, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{name} is stubbed by benchmarks/authors_shims")

    return type(name, (torch.nn.Module,), {"__init__": init})


class Compose:
    """Apply ``transforms`` one after another (torchvision.transforms.Compose's contract)."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, sample: Any) -> Any:
        for t in self.transforms:
            sample = t(sample)
        return sample


def make_grid(images: torch.Tensor, nrow: int = 8, padding: int = 2) -> torch.Tensor:
    """Tile a batch (N, C, H, W) into one (3, H', W') image, ``nrow`` images per row."""
    if images.dim() == 3:
        images = images.unsqueeze(1)
    if images.shape[1] == 1:
        images = images.repeat(1, 3, 1, 1)
    n, c, h, w = images.shape
    cols = min(nrow, n)
    rows = math.ceil(n / cols)
    grid = images.new_zeros(c, rows * (h + padding) + padding, cols * (w + padding) + padding)
    for i in range(n):
        y = padding + (i // cols) * (h + padding)
        x = padding + (i % cols) * (w + padding)
        grid[:, y : y + h, x : x + w] = images[i]
    return grid


def _tree_filter_cuda(module: types.ModuleType) -> None:
    def missing(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("tree_filter_cuda (CUDA-only) is stubbed")

    for fn in ("mst_forward", "bfs_forward", "refine_forward", "refine_backward_feature"):
        setattr(module, fn, missing)


_STUBS: dict[str, Callable[[types.ModuleType], None]] = {
    "tree_filter_cuda": _tree_filter_cuda,
    "torchvision": lambda m: None,
    "torchvision.transforms": lambda m: setattr(m, "Compose", Compose),
    "torchvision.utils": lambda m: setattr(m, "make_grid", make_grid),
    "torchvision.models": lambda m: None,
    "torchvision.models.densenet": lambda m: setattr(m, "DenseNet", _unavailable("DenseNet")),
    "torchvision.models.resnet": lambda m: [
        setattr(m, n, _unavailable(n)) for n in ("ResNet", "BasicBlock", "Bottleneck")
    ],
}
_LIB = "utils.TreeEnergyLoss.lib"
_LIB_NAMES = {
    f"{_LIB}.models.nets.fcnet": "FcnNet",
    f"{_LIB}.models.nets.treefcn": "TreeFCN",
    f"{_LIB}.models.nets.deeplabv3plus": "DeepLabV3Plus",
    f"{_LIB}.utils.tools.configer": "Configer",
}


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stub modules above; every other import goes the normal way."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in _STUBS or fullname == _LIB or fullname.startswith(_LIB + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package, so that submodules resolve through this finder
        name = module.__name__
        if name in _STUBS:
            _STUBS[name](module)
        elif name in _LIB_NAMES:
            setattr(module, _LIB_NAMES[name], _unavailable(_LIB_NAMES[name]))


sys.meta_path.insert(0, _StubFinder())
