"""``fedseg export``: a run's evaluation models as plain PyTorch files (and ONNX).

``DIR/<site>.pt`` (and ``DIR/global.pt`` when the method has a global model) is a
``torch.save`` of plain data, loadable with ``torch.load(weights_only=True)``:

- ``state_dict``: the evaluation model's weights and buffers,
- ``config``: the run's resolved config (``config.yaml`` as a mapping), ``spec``: the
  federation spec (JSON), ``info``: :class:`~fedseg.inference.ModelInfo` (class names,
  channels, training size, regions, normalisation),
- ``rebuildable``: whether the method's network with ``state_dict`` reproduces the evaluation
  model's label maps on the site's test images (False when the evaluation model carries more
  than weights, e.g. a site index or a routed mixture; then only the ONNX file reproduces it).

``--onnx`` adds ``DIR/<site>.onnx``: the model plus the method's ``segment`` hook, images
``[N, C, *training size]`` -> label maps ``[N, *S]``, checked with onnxruntime against
PyTorch on the site's test images (:mod:`fedseg.onnx_model`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from fedseg.config import dump_config, from_run_dump, parse_config
from fedseg.engine.server import make_method, spec_from_json, spec_to_json
from fedseg.engine.worker import initial_model
from fedseg.errors import ConfigError, DataError
from fedseg.inference import GLOBAL, ModelInfo, RunModels, SiteModel, label_map_module, labels_of
from fedseg.methods.training import Precision
from fedseg.onnx_model import OnnxLabelMaps, onnx_path, write_onnx

__all__ = ["FORMAT", "export_run", "load_exported"]

log = logging.getLogger(__name__)

FORMAT = "fedseg-model/1"


def export_run(
    models: RunModels,
    out: str | Path,
    names: list[str] | None = None,
    *,
    onnx: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Export the models ``names`` (default: every site and the global model) of a run;
    with ``onnx`` each also as an ONNX file checked against PyTorch on test images.
    ``progress(done, total)`` is called after each model."""
    names = names or models.model_names()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for done, name in enumerate(names, 1):
        sm = models.site_model(name)
        probe = models.sites[models.site_names[0] if name == GLOBAL else name].test_images
        probe = probe[: models.cfg.eval.batch_size]
        state = {k: v.detach().cpu() for k, v in sm.model.state_dict().items()}
        record: dict[str, Any] = {
            "format": FORMAT,
            "state_dict": state,
            "config": yaml.safe_load(dump_config(models.cfg)),
            "spec": spec_to_json(models.spec),
            "info": sm.info.to_dict(),
            "rebuildable": _rebuildable(models, state, sm, probe),
        }
        path = out / f"{name}.pt"
        torch.save(record, path)
        written.append(path)
        if onnx:
            differ = write_onnx(label_map_module(sm), probe, onnx_path(path))
            log.info(
                "%s: onnxruntime and PyTorch agree on %.3f%% of the pixels of %d test images",
                onnx_path(path).name,
                100 * (1 - differ),
                len(probe),
            )
            written.append(onnx_path(path))
        if progress is not None:
            progress(done, len(names))
    return written


def _rebuildable(
    models: RunModels, state: dict[str, torch.Tensor], sm: SiteModel, probe: torch.Tensor
) -> bool:
    """Whether the method's network loaded with ``state`` gives ``sm``'s label maps."""
    fresh = initial_model(models.method, models.cfg.seed, sm.device)
    try:
        fresh.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError):
        return False
    rebuilt = SiteModel(fresh, sm.segment, sm.info, sm.device, sm.precision)
    return bool(torch.equal(rebuilt.label_maps(probe), sm.label_maps(probe)))


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable or unsafe file
        raise DataError(f"{path}: not readable as a fedseg export ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise DataError(f"{path}: not a fedseg export (expected format {FORMAT!r})")
    return record


def load_exported(path: str | Path, device: torch.device | str = "cpu") -> SiteModel:
    """The model of an export: the method's network with the saved weights, or (when those
    do not reproduce the evaluation model, or ``path`` is the ``.onnx`` file) the ONNX file,
    run by onnxruntime; an ONNX file takes its class names and training size from the
    ``.pt`` that export wrote beside it."""
    path, device = Path(path), torch.device(device)
    if path.suffix.lower() == ".onnx":
        pt = path.with_suffix(".pt")
        if not pt.is_file():
            raise DataError(
                f"{path}: an ONNX file alone lacks the class names and training size that "
                f"predict needs; keep {pt.name} (written beside it by fedseg export) there, "
                "or pass the .pt or the run directory"
            )
        info = ModelInfo.from_dict(_read_record(pt)["info"])
        return SiteModel(OnnxLabelMaps(path), labels_of, info, device)
    record = _read_record(path)
    info = ModelInfo.from_dict(record["info"])
    cfg = parse_config(from_run_dump(record["config"]), str(path))
    spec = spec_from_json(record["spec"])
    method = make_method(cfg, spec)
    if record["rebuildable"]:
        model = initial_model(method, cfg.seed, device)
        model.load_state_dict(record["state_dict"])
        used = Precision(cfg.engine.amp, cfg.engine.channels_last).resolve(
            method.model_cfg, spec.ndim, device, method.bf16_auto
        )
        return SiteModel(model.eval(), method.segment, info, device, used)
    onnx_file = onnx_path(path)
    if not onnx_file.is_file():
        raise ConfigError(
            f"{path}: the {info.method} model of {info.site!r} is more than its weights; "
            f"export it with --onnx ({onnx_file.name}) or predict from the run directory"
        )
    return SiteModel(OnnxLabelMaps(onnx_file), labels_of, info, device)
