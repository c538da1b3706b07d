"""Aggregation helpers shared by methods: weighted averages of named tensors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from fedseg.methods.base import Payload

__all__ = ["average_state", "sample_weights", "weighted_average"]


def sample_weights(uploads: Mapping[str, Payload]) -> dict[str, float]:
    """Weights proportional to each upload's ``num_examples`` (FedAvg)."""
    total = sum(u.num_examples for u in uploads.values())
    return {s: u.num_examples / total for s, u in uploads.items()}


def average_state(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    keys: Iterable[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Weighted sum of tensors key by key (weights should sum to 1).

    Integer tensors (e.g. BN ``num_batches_tracked``) are averaged in float and rounded.
    """
    names = list(keys) if keys is not None else list(states[0])
    out = {}
    for k in names:
        acc = sum(w * s[k].double() for s, w in zip(states, weights, strict=True))
        ref = states[0][k]
        out[k] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


def weighted_average(
    uploads: Mapping[str, Payload],
    weights: Mapping[str, float] | None = None,
    keys: Iterable[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Average the uploaded tensors; weights default to sample counts."""
    w = weights if weights is not None else sample_weights(uploads)
    sites = list(uploads)
    return average_state([uploads[s].tensors for s in sites], [w[s] for s in sites], keys)
