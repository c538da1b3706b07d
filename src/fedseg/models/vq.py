"""A vector quantiser with the straight-through estimator (VQ-VAE, van den Oord et al. 2017).

The quantiser replaces every feature vector by its nearest codebook entry (squared L2) and
lets the gradient pass to the input unchanged (straight-through). It records its loss
``weight * (||sg(z) - e||^2 + beta * ||z - sg(e)||^2)`` at each forward; the training loop
takes it with :meth:`VectorQuantizer.pop_auxiliary_loss` (the auxiliary-loss hook of
:func:`fedseg.methods.training.train_steps`), which also tallies the codes used, reported as
perplexity and dead codes by :meth:`VectorQuantizer.auxiliary_metrics`.

Forwards under ``torch.no_grad()`` (evaluation, validation, feature passes) record nothing,
so the network can be deep-copied after them. The codebook is an ordinary parameter updated
by the optimiser through the codebook term (no EMA), so every federated method aggregates it
like any other weight.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["VectorQuantizer", "perplexity"]


def perplexity(counts: torch.Tensor) -> float:
    """``exp`` of the entropy of the code-usage histogram ``counts`` (1 = a single code in
    use, ``len(counts)`` = all codes used equally); 0 for an empty histogram."""
    total = float(counts.sum())
    if total == 0:
        return 0.0
    p = counts.double() / total
    p = p[p > 0]
    return math.exp(float(-(p * p.log()).sum()))


class VectorQuantizer(nn.Module):
    """Nearest-code quantisation of ``[B, D, *S]`` features with a ``[K, D]`` codebook.

    Args:
        num_codes: codebook size K.
        dim: code dimension D (the input's channel count).
        beta: commitment weight (0.25, VQ-VAE).
        weight: lambda_vq, the weight of the whole VQ loss in the training loss.

    The codebook starts ``N(0, 1)`` (``nn.Embedding``'s default), the scale of the
    normalised features it quantises.
    """

    def __init__(self, num_codes: int, dim: int, beta: float = 0.25, weight: float = 1.0) -> None:
        super().__init__()
        self.codebook = nn.Embedding(num_codes, dim)
        self.beta, self.weight = beta, weight
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tally: tuple[torch.Tensor, float, int] | None = None

    @property
    def num_codes(self) -> int:
        return self.codebook.num_embeddings

    def codes(self, flat: torch.Tensor) -> torch.Tensor:
        """Index of the nearest code (squared L2) of every row of ``flat`` ``[N, D]``."""
        e = self.codebook.weight
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ e.t() + e.pow(2).sum(1)
        return dist.argmin(1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        flat = z.movedim(1, -1).reshape(-1, z.shape[1])
        idx = self.codes(flat.detach())
        q = self.codebook(idx)
        if torch.is_grad_enabled():  # a forward that can be trained on (never under no_grad)
            loss = F.mse_loss(q, flat.detach()) + self.beta * F.mse_loss(flat, q.detach())
            self._last = (self.weight * loss, torch.bincount(idx, minlength=self.num_codes))
        out = flat + (q - flat).detach()  # straight-through: d out / d z = identity
        return out.reshape(*z.shape[:1], *z.shape[2:], z.shape[1]).movedim(-1, 1)

    def pop_auxiliary_loss(self) -> torch.Tensor | None:
        """The weighted VQ loss of the last forward (None if there was none since the last
        call); its code usage joins the tally of :meth:`auxiliary_metrics`."""
        if self._last is None:
            return None
        loss, counts = self._last
        self._last = None
        if self._tally is None:
            self._tally = (counts, float(loss.detach()), 1)
        else:
            total, loss_sum, n = self._tally
            self._tally = (total + counts, loss_sum + float(loss.detach()), n + 1)
        return loss

    def auxiliary_metrics(self) -> dict[str, float]:
        """Code usage over the training forwards since the last call (then reset):
        ``vq_loss`` (mean weighted loss), ``vq_perplexity``, ``vq_dead_codes`` (codes never
        chosen) and ``vq_codes`` (K)."""
        if self._tally is None:
            return {}
        counts, loss_sum, n = self._tally
        self._tally = None
        return {
            "vq_loss": loss_sum / n,
            "vq_perplexity": perplexity(counts),
            "vq_dead_codes": float((counts == 0).sum()),
            "vq_codes": float(self.num_codes),
        }
