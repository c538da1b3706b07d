"""Parity shim for jcwang123/PFL-Seg-Trans @ d715417c (FedDP's code): loaded into its one
training process by ``benchmarks/parity/pflseg.py`` through ``PYTHONPATH`` (Python imports
``sitecustomize`` at start-up). Its files run unmodified.

1. torchvision (imported by timm and segmentation-models-pytorch): as for FedBCS, the
   ``nms``/``qnms`` schemas are declared before it loads. numpy 2: ``np.str`` (its
   ``--load_weight`` type) is ``str`` again, and ``numpy.core.numeric.Inf`` (imported by
   its ``utils``) is ``inf``.
2. CPU: ``Tensor.cuda()`` and ``Module.cuda()`` return the object itself, ``.to('cuda')``
   stays on the CPU, ``torch.load`` maps to the CPU.
3. Data: ``glob.glob`` patterns under its hard-coded prefix ``/raid/wjc/data/SpecializedFedSeg``
   are read under ``$FEDSEG_PARITY_DATA`` (its loader and tester glob that prefix).
4. Seeds: ``train_fed.py`` never seeds torch, numpy or random (``--seed`` reaches only its
   ``worker_init_fn``); they are seeded here with its ``--seed`` before it starts.
5. ``scripts.tester_utils.eval_container`` (the per-round test of each site's model) is
   wrapped when called for the per-round score (``info=False``): the model is wrapped so
   that each test image's mask is recorded as its tester thresholds it
   (``net(x)[0, 0] > 0.5``; before its 1-pixel guard for empty predictions), saved with
   the globbed file names (its order) and its mean Jaccard to
   ``$FEDSEG_PARITY_CAPTURE/site{k}_round{r:04d}.npz``; with ``$FEDSEG_PARITY_KEEP_LAST``
   (the driver's ``--ft-epochs``) also the model's weights to ``site{k}_last.pth``
   (overwritten: the last evaluated model, from which the driver starts ``train_ft.py``).
   The wrapper returns the model's own outputs and the function's own scores.
6. Diagnostic only, with ``$FEDSEG_PARITY_FRESH_DRAWS`` (the driver's ``--fresh-draws``):
   every ``DataLoader`` with workers keeps them over its passes (``persistent_workers``), so
   the worker's ``random`` runs on and each round draws anew instead of replaying the first
   round's 300 draws (a defect of the code, docs/methods/feddp.md); this removes the defect
   to measure its effect, and such a run is no parity arm of the code as published.
"""

from __future__ import annotations

import glob as _glob
import os
import random
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import numpy.core.numeric as _numeric
import torch
from parity_hooks import declare_torchvision_ops, patch_after_import

declare_torchvision_ops()
np.str = str  # type: ignore[attr-defined]
_numeric.Inf = np.inf  # type: ignore[attr-defined]

torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
_tensor_to, _module_to, _load = torch.Tensor.to, torch.nn.Module.to, torch.load


def _cpu(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)


torch.Tensor.to = lambda self, *a, **k: _tensor_to(self, *_cpu(a), **k)  # type: ignore[method-assign]
torch.nn.Module.to = lambda self, *a, **k: _module_to(self, *_cpu(a), **k)  # type: ignore[method-assign]
torch.load = lambda *a, **k: _load(*a, **{"map_location": "cpu", **k})

PREFIX = "/raid/wjc/data/SpecializedFedSeg"
DATA = os.environ.get("FEDSEG_PARITY_DATA", PREFIX)
CAPTURE = os.environ.get("FEDSEG_PARITY_CAPTURE")
KEEP_LAST = bool(os.environ.get("FEDSEG_PARITY_KEEP_LAST"))
FRESH_DRAWS = bool(os.environ.get("FEDSEG_PARITY_FRESH_DRAWS"))
_real_glob = _glob.glob


def _glob_redirect(pattern: str, *args: Any, **kwargs: Any) -> list[str]:
    return _real_glob(str(pattern).replace(PREFIX, DATA, 1), *args, **kwargs)


_glob.glob = _glob_redirect

if FRESH_DRAWS:
    _loader_init = torch.utils.data.DataLoader.__init__

    def _persistent(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0) > 0:
            kwargs["persistent_workers"] = True
        _loader_init(self, *args, **kwargs)

    torch.utils.data.DataLoader.__init__ = _persistent  # type: ignore[method-assign]

if "--seed" in sys.argv:
    seed = int(sys.argv[sys.argv.index("--seed") + 1])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Recorder:
    """Stands for the tested model; records each thresholded prediction."""

    def __init__(self, net: Any) -> None:
        self._net = net
        self.preds: list[np.ndarray] = []

    def __call__(self, x: torch.Tensor) -> Any:
        out = self._net(x)
        self.preds.append((out.detach().cpu().numpy()[0, 0] > 0.5).astype(np.uint8))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)


def _patch(module: types.ModuleType) -> None:
    original = module.eval_container
    rounds: dict[int, int] = {}

    def eval_container(site_index: int, test_net: Any, args: Any, info: bool = False) -> Any:
        if info or args.dataset != "polyp":
            return original(site_index, test_net, args, info)
        rec = _Recorder(test_net)
        scores = original(site_index, rec, args, info)
        names = module.glob(f"{PREFIX}/{args.dataset}/Site{site_index + 1}/test/image/*")
        if len(names) != len(rec.preds):
            raise RuntimeError(f"parity shim: {len(rec.preds)} predictions, {len(names)} cases")
        r = rounds[site_index] = rounds.get(site_index, -1) + 1
        Path(CAPTURE).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            Path(CAPTURE) / f"site{site_index}_round{r:04d}.npz",
            names=np.array([os.path.relpath(n, DATA) for n in names]),
            preds=np.stack(rec.preds),
            jaccard=np.float64(np.mean(scores[0])),
        )
        if KEEP_LAST:
            torch.save(test_net.state_dict(), Path(CAPTURE) / f"site{site_index}_last.pth")
        return scores

    module.eval_container = eval_container


if CAPTURE:
    patch_after_import({"scripts.tester_utils": _patch})
