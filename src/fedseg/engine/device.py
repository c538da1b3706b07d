"""The torch device a run or a prediction uses, checked against what this torch can reach."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import cv2
import numpy as np
import torch

from fedseg.errors import ConfigError

__all__ = ["machine", "resolve_device"]


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


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def machine(device: torch.device) -> dict[str, str | int]:
    """What a run ran on, for reading its timings: the CPU model and cores, torch's threads,
    the device (with the GPU's name) and the versions of torch, numpy and OpenCV (the
    synthetic federations are drawn with the last two)."""
    name = str(device)
    if device.type == "cuda":
        name = f"{device} ({torch.cuda.get_device_name(device)})"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "threads": torch.get_num_threads(),
        "device": name,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "opencv": cv2.__version__,
    }
