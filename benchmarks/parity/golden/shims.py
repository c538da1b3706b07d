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


@contextmanager
def stub_modules(names: Sequence[str]) -> Iterator[None]:
    """Empty modules under ``names`` while the block runs: imports at the top of a reference
    file that the checked function never uses (e.g. ``torchvision``, which does not load
    beside the CPU torch here)."""
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
