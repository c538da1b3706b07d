"""Aggregation helpers shared by methods: weighted averages of named tensors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from fedseg.methods.base import Payload

__all__ = ["RunningAverage", "average_state", "sample_weights", "weighted_average"]


def sample_weights(uploads: Mapping[str, Payload]) -> dict[str, float]:
    """Weights proportional to each upload's ``num_examples`` (FedAvg)."""
    total = sum(u.num_examples for u in uploads.values())
    return {s: u.num_examples / total for s, u in uploads.items()}


class RunningAverage:
    """Weighted average of named tensors, accumulated one state at a time in float64.

    Holds one running sum, so averaging N uploads needs the memory of about two models, not
    N. Weights need not be normalised; the result is divided by their sum. Integer tensors
    (e.g. BN ``num_batches_tracked``) are averaged in float and rounded.
    """

    def __init__(self, keys: Iterable[str] | None = None) -> None:
        self.keys = list(keys) if keys is not None else None
        self.total = 0.0
        self._sum: dict[str, torch.Tensor] = {}
        self._dtype: dict[str, torch.dtype] = {}

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        if self.keys is None:
            self.keys = list(state)
        for k in self.keys:
            t = state[k].detach()
            if k in self._sum:
                self._sum[k].add_(t.double(), alpha=weight)
            else:
                self._sum[k] = t.double() * weight
                self._dtype[k] = t.dtype
        self.total += weight

    def result(self) -> dict[str, torch.Tensor]:
        if not self._sum or self.total <= 0:
            raise ValueError("RunningAverage: nothing with a positive weight was added")
        out = {}
        for k, acc in self._sum.items():
            mean = acc / self.total
            dtype = self._dtype[k]
            out[k] = mean.to(dtype) if dtype.is_floating_point else mean.round().to(dtype)
        return out


def average_state(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    keys: Iterable[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Weighted average of tensors key by key (see :class:`RunningAverage`)."""
    avg = RunningAverage(keys)
    for s, w in zip(states, weights, strict=True):
        avg.add(s, w)
    return avg.result()


def weighted_average(
    uploads: Mapping[str, Payload],
    weights: Mapping[str, float] | None = None,
    keys: Iterable[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Average the uploaded tensors; weights default to sample counts."""
    w = weights if weights is not None else sample_weights(uploads)
    sites = list(uploads)
    return average_state([uploads[s].tensors for s in sites], [w[s] for s in sites], keys)
