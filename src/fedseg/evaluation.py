"""Evaluate a model on one site's split: per-region metrics averaged over cases."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedseg.methods.training import autocast, channels_last_model, memory_format
from fedseg.metrics import MetricAccumulator

__all__ = ["Segmenter", "SiteEvaluation", "argmax_segment", "evaluate", "predict"]

Segmenter = Callable[[nn.Module, torch.Tensor], torch.Tensor]
"""(model, images [N,C,*S]) -> label maps [N,*S] (a method's ``segment`` hook)."""


def argmax_segment(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Arg-max over the output channels."""
    return model(images).argmax(1)


def predict(
    model: nn.Module,
    images: torch.Tensor,
    batch_size: int,
    device: torch.device,
    segment: Segmenter = argmax_segment,
) -> torch.Tensor:
    """Label maps of ``images`` [N,C,*S] computed in batches (eval mode), under the current
    :func:`~fedseg.methods.training.precision` (``engine.amp``, ``engine.channels_last``)
    and ``torch.inference_mode`` (entered inside the layout change, so that the weights the
    layout change writes back stay ordinary tensors that training can use)."""
    model.eval()
    with channels_last_model(model), autocast(device), torch.inference_mode():
        preds = [
            segment(model, memory_format(images[i : i + batch_size].to(device))).cpu()
            for i in range(0, len(images), batch_size)
        ]
    return torch.cat(preds) if preds else torch.zeros((0, *images.shape[2:]), dtype=torch.long)


@dataclass
class SiteEvaluation:
    """Mean metrics ``{metric: {region: value}}`` over ``cases`` test cases."""

    metrics: dict[str, dict[str, float]]
    cases: int
    per_case: list[dict[str, object]]


def evaluate(
    model: nn.Module,
    images: torch.Tensor,
    masks: torch.Tensor,
    regions: Mapping[str, Sequence[int]],
    *,
    batch_size: int,
    device: torch.device,
    spacing: Sequence[Sequence[float]] | None = None,
    ids: Sequence[str] | None = None,
    segment: Segmenter = argmax_segment,
) -> SiteEvaluation:
    """Predict every case and score it against its full mask."""
    acc = MetricAccumulator(regions)
    for i in range(0, len(images), batch_size):
        pred = predict(model, images[i : i + batch_size], batch_size, device, segment)
        sp = list(spacing[i : i + batch_size]) if spacing is not None else None
        case_ids = list(ids[i : i + batch_size]) if ids is not None else None
        acc.add(pred, masks[i : i + batch_size], spacing=sp, ids=case_ids)
    return SiteEvaluation(acc.aggregate(), len(images), list(acc.per_case))
