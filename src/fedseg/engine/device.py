"""The torch device a run or a prediction uses, checked against what this torch can reach."""

from __future__ import annotations

import torch

from fedseg.errors import ConfigError

__all__ = ["resolve_device"]


def resolve_device(name: str, setting: str = "engine.device") -> torch.device:
    """``auto`` picks CUDA when available; ``cpu``, ``cuda``, ``cuda:N`` and ``mps`` must be
    usable here.

    Raises:
        ConfigError: naming ``setting`` for an unknown name or a device this machine's torch
            cannot use (a CPU-only build asked for ``cuda``, a GPU index beyond the count).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"{setting} must be cpu, cuda, cuda:N, mps or auto, got {name!r}"
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "has no CUDA" if torch.version.cuda is None else "finds no GPU"
            raise ConfigError(
                f"{setting}: {name!r} requested but this torch ({torch.__version__}) {build}; "
                "use cpu or auto, or install a CUDA build of torch"
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"{setting}: {name!r} requested but this machine has {count} GPU(s) "
                f"(cuda:0 to cuda:{count - 1})"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{setting}: 'mps' requested but this machine has no Apple GPU; use cpu")
    return device
