"""The smallest adjustments some reference functions need to run here (listed with why in
README.md). Each is a context manager that undoes itself."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


@contextmanager
def cpu_cuda() -> Iterator[None]:
    """``Tensor.cuda()`` and ``Module.cuda()`` return the object itself (it stays on the CPU)."""
    saved = torch.Tensor.cuda, torch.nn.Module.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda = saved  # type: ignore[method-assign]


class _Inert:
    """Stands for anything: every attribute and every call give the same object."""

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return self

    def __getattr__(self, name: str) -> _Inert:
        return self


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Inert:
        return _Inert()


@contextmanager
def stub_modules(names: Sequence[str]) -> Iterator[None]:
    """Stub modules under ``names`` while the block runs, whose every attribute is inert:
    imports at the top of a reference file that the checked function never uses (e.g.
    ``torchvision``, which does not load beside the CPU torch here, and the transforms
    such a file builds at import time)."""
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = _StubModule(n)
        parent, _, child = n.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[n])
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
