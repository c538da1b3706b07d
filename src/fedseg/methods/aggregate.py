"""Aggregation helpers shared by methods: weighted averages of named tensors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from fedseg.methods.base import Payload

__all__ = ["RunningAverage", "average_state", "mix_states", "sample_weights", "weighted_average"]

_BLOCK_BYTES = 64 * 2**20
"""Memory of one float64 block of :func:`mix_states` (inputs and results)."""


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


def mix_states(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: torch.Tensor,
    keys: Iterable[str] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Row ``i`` of ``weights`` (``[M, len(states)]``, non-negative) mixes ``states`` into the
    i-th result: what :func:`average_state` gives for that row, for every row at once.

    Personalised aggregation (a model per site from every site's upload) costs M x N x
    parameters multiply-adds; here they run as float64 matrix products over blocks of columns
    of about 64 MiB, instead of M separate running averages. Each result owns its tensors
    (no views into a shared buffer), so one site's payload pickles alone.
    """
    w = weights.detach().to(torch.float64)
    if w.ndim != 2 or w.shape[1] != len(states) or not states:
        raise ValueError(
            f"mix_states: weights must be [M, {len(states)}] for {len(states)} states, "
            f"got {list(w.shape)}"
        )
    totals = w.sum(1, keepdim=True)
    if bool((w < 0).any()) or bool((totals <= 0).any()):
        raise ValueError("mix_states: weights must be non-negative with a positive sum per row")
    rows = w.shape[0]
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(rows)]
    block = max(1, _BLOCK_BYTES // (8 * (len(states) + rows)))
    for k in list(keys) if keys is not None else list(states[0]):
        flat = [s[k].detach().reshape(-1) for s in states]
        ref = states[0][k]
        res = [torch.empty(ref.shape, dtype=ref.dtype, device=ref.device) for _ in range(rows)]
        views = [r.view(-1) for r in res]
        for a in range(0, ref.numel(), block):
            x = torch.stack([f[a : a + block] for f in flat]).to(torch.float64)
            mean = (w.to(x.device) @ x) / totals.to(x.device)
            if not ref.dtype.is_floating_point:
                mean = mean.round()
            for v, m in zip(views, mean, strict=True):
                v[a : a + block] = m
        for o, r in zip(out, res, strict=True):
            o[k] = r
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
