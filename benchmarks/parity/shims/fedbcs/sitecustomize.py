"""Parity shim for zxy1234321/FedBCS @ f2034353: loaded into its one process by
``benchmarks/parity/fedbcs.py`` through ``PYTHONPATH`` (Python imports ``sitecustomize`` at
start-up). Its files run unmodified.

1. ``torchvision::nms`` and ``torchvision::qnms`` operator schemas are declared (no kernels)
   before torchvision loads: the only torchvision wheel served here is a CUDA build whose
   import fails beside the CPU torch on registering kernels for undeclared operators. The
   code never calls nms.
2. ``dataset.myfddataset``: its transforms hard-code ``Resized(spatial_size=[256, 256])``;
   the module's name ``Resized`` is wrapped so that the size is ``$FEDSEG_PARITY_SIZE`` (the
   federation's, so that training and predictions stay at the images' own size).
3. ``fd_trainer.training.global_evaluate_pl`` (the per-round evaluation of the global model
   on every domain's val list) is wrapped: the global net is wrapped for the call so that
   each output's label map is recorded as its metric sees it (its own ``post_pred``,
   class-1 channel), and the per-domain predictions, the list files' image names in loader
   order and its class-1 Dice per domain are written to
   ``$FEDSEG_PARITY_CAPTURE/round{epoch_index:04d}.npz``. The wrapper returns the net's own
   outputs and the function's own results.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from parity_hooks import declare_torchvision_ops, patch_after_import

declare_torchvision_ops()

CAPTURE = os.environ.get("FEDSEG_PARITY_CAPTURE")
SIZE = int(os.environ.get("FEDSEG_PARITY_SIZE", "256"))


class _Recorder(torch.nn.Module):
    """Stands for the global net; records the label map of each output."""

    def __init__(self, net: torch.nn.Module, post_pred: Callable[[Any], Any]) -> None:
        super().__init__()
        self.net = net
        self.post_pred = post_pred
        self.preds: list[np.ndarray] = []

    def forward(self, x: torch.Tensor) -> Any:
        out = self.net(x)
        for item in out:
            self.preds.append(np.asarray(self.post_pred(item)[1].cpu()).astype(np.uint8))
        return out


def _patch_dataset(module: types.ModuleType) -> None:
    original = module.Resized

    def resized(*args: Any, **kwargs: Any) -> Any:
        kwargs["spatial_size"] = [SIZE, SIZE]
        return original(*args, **kwargs)

    module.Resized = resized


def _patch_training(module: types.ModuleType) -> None:
    original = module.global_evaluate_pl

    def global_evaluate_pl(model: Any, test_dl: Any, *args: Any, **kwargs: Any) -> Any:
        if model.N_CLASS != 2:
            raise NotImplementedError("parity shim: binary segmentation only")
        net = model.global_net
        rec = model.global_net = _Recorder(net, module.post_pred)
        try:
            accs, hd95s, assds = original(model, test_dl, *args, **kwargs)
        finally:
            model.global_net = net
        names = [[str(c[0]) for c in dl.dataset.all_data] for dl in test_dl]  # unshuffled
        if sum(map(len, names)) != len(rec.preds):
            raise RuntimeError(f"parity shim: {len(rec.preds)} predictions for {names}")
        Path(CAPTURE).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            Path(CAPTURE) / f"round{model.epoch_index:04d}.npz",
            names=np.array([n for d in names for n in d]),
            preds=np.stack(rec.preds),
            class1_dice=np.array([float(a[1]) for a in accs]),
        )
        return accs, hd95s, assds

    module.global_evaluate_pl = global_evaluate_pl


_PATCHES = {"dataset.myfddataset": _patch_dataset, "fd_trainer.training": _patch_training}


if CAPTURE:
    patch_after_import(_PATCHES)
