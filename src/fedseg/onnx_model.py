"""ONNX files of site models: written with torch's exporter and checked against PyTorch on
the site's test images, run with onnxruntime (``pip install 'fedseg[onnx]'``)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from fedseg.errors import ConfigError, DataError

__all__ = ["MAX_DISAGREEMENT", "OnnxLabelMaps", "onnx_path", "write_onnx"]

MAX_DISAGREEMENT = 1e-3
"""Largest fraction of pixels (voxels) of the check images whose label may differ between
onnxruntime and PyTorch (ties between classes may break apart in the last float bit)."""


def onnx_path(path: Path) -> Path:
    """Where the ONNX file of the export ``path`` lies (``<name>.onnx``)."""
    return path.with_name(path.name.removesuffix(".pt") + ".onnx")


def _require(what: str) -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"{what} needs onnx, onnxscript and onnxruntime ({e.name} is missing): "
            "pip install 'fedseg[onnx]'"
        ) from None


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's notes about torch internals (deprecations inside torch,
    optional torchvision operators): nothing a user can act on."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def write_onnx(module: nn.Module, check_images: torch.Tensor, path: Path) -> float:
    """Write ``module`` (images ``[N, C, *S]`` -> label maps ``[N, *S]``; any batch size) to
    ``path`` and return the fraction of pixels of ``check_images`` whose label onnxruntime
    and PyTorch disagree on.

    Raises:
        ConfigError: when the ONNX packages are missing, or the file disagrees with PyTorch on
            more than :data:`MAX_DISAGREEMENT` of the pixels (the file is then removed).
    """
    _require("ONNX export")
    module = module.eval().cpu()
    x = check_images.detach().cpu().float()
    batch = torch.export.Dim("batch")
    with _quiet_exporter(), torch.no_grad():
        torch.onnx.export(
            module,
            (x[:1],),
            str(path),
            input_names=["images"],
            output_names=["labels"],
            dynamic_shapes=({0: batch},),
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        want = module(x)
    got = OnnxLabelMaps(path)(x)
    disagreement = float((got != want).float().mean()) if want.numel() else 0.0
    if got.shape != want.shape or disagreement > MAX_DISAGREEMENT:
        path.unlink()
        raise ConfigError(
            f"{path}: onnxruntime's label maps differ from PyTorch's on {disagreement:.2%} of "
            f"the check images' pixels (at most {MAX_DISAGREEMENT:.1%} allowed); not written"
        )
    return disagreement


class OnnxLabelMaps(nn.Module):
    """An ONNX file run by onnxruntime on the CPU, as a module images -> label maps."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        _require(f"{path}")
        import onnxruntime as ort

        try:
            self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as e:  # every way a damaged file fails to load is that file's problem
            raise DataError(f"{path}: not readable as an ONNX model ({e})") from None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.detach().cpu().float().contiguous().numpy()
        return torch.from_numpy(self.session.run(["labels"], {"images": x})[0])
