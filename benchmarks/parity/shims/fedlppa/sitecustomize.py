"""Parity shim for llmir/FedLPPA @ 6594e1a (``code_v4``): records each client's test
predictions, loaded into the authors' server and client processes by
``benchmarks/parity/fedlppa.py`` through ``PYTHONPATH`` (Python imports ``sitecustomize`` at
start-up). Their files run unmodified.

1. Loads ``benchmarks/authors_shims/sitecustomize.py`` (``.cuda()`` a no-op, stubs for the
   CUDA-only and unloadable imports): the CPU adjustments ``benchmarks/authors_toy.py`` uses.
2. When their ``flower_common_v4_addprostate`` is imported, wraps two of its names:
   ``BaseClient._validate`` (the client's evaluation, called once per round on its test
   split) marks the next call of the module's ``evaluate(args, model, dataloader, amp)``;
   that call gets the model wrapped so that each forward's prediction is recorded exactly
   as their ``val_2D.test_single_volume`` computes it (``argmax(softmax(net(x)[0]))``).
   The predictions, the test file names in loader order and their own
   ``val_mean_dice`` (what their best-model selection compares) are written to
   ``$FEDSEG_PARITY_CAPTURE/client{cid}_iter{current_iter:06d}.npz``. Nothing their code
   computes is changed: the wrapper returns the model's own outputs.
"""

from __future__ import annotations

import importlib.util
import os
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from parity_hooks import patch_after_import

_AUTHORS_SHIMS = Path(__file__).resolve().parents[3] / "authors_shims" / "sitecustomize.py"
_spec = importlib.util.spec_from_file_location("_fedseg_authors_shims", _AUTHORS_SHIMS)
assert _spec is not None and _spec.loader is not None, _AUTHORS_SHIMS
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))

CAPTURE = os.environ.get("FEDSEG_PARITY_CAPTURE")
TARGET = "flower_common_v4_addprostate"


class _Recorder:
    """Stands for the evaluated model; records the label map of every forward."""

    def __init__(self, net: Any) -> None:
        self._net = net
        self.preds: list[np.ndarray] = []

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = self._net(x, *args, **kwargs)
        label = torch.argmax(torch.softmax(out[0], dim=1), dim=1)
        self.preds.append(label[0].cpu().numpy().astype(np.uint8))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)


def _patch(module: types.ModuleType) -> None:
    original_evaluate = module.evaluate
    original_validate = module.BaseClient._validate
    pending: list[tuple[Any, int]] = []

    def evaluate(args: Any, model: Any, dataloader: Any, amp: bool = False) -> Any:
        if not pending:
            return original_evaluate(args, model, dataloader, amp)
        cid, it = pending.pop()
        rec = _Recorder(model)
        metrics = original_evaluate(args, rec, dataloader, amp)
        names = [str(n) for n in dataloader.dataset.sample_list]
        if len(names) != len(rec.preds):
            raise RuntimeError(f"parity shim: {len(rec.preds)} predictions, {len(names)} cases")
        Path(CAPTURE).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            Path(CAPTURE) / f"client{cid}_iter{it:06d}.npz",
            names=np.array(names),
            preds=np.stack(rec.preds),
            val_mean_dice=np.float64(metrics["val_mean_dice"]),
        )
        return metrics

    def _validate(self: Any, config: Any) -> Any:
        pending[:] = [(self.cid, self.current_iter)]
        try:
            return original_validate(self, config)
        finally:
            pending.clear()

    module.evaluate = evaluate
    module.BaseClient._validate = _validate


if CAPTURE:
    patch_after_import({TARGET: _patch})
