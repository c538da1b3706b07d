"""FedUV (Son et al., CVPR 2024): uniformity and variance regularisers for local training.

Local training adds ``std_coeff * L_var + unif_coeff * L_unif``: a hinge that keeps the
per-class standard deviation of the predicted probabilities across samples at least that of
the identity matrix's columns (so predictions do not collapse to one class, emulating an
IID batch), and the hyperspherical uniformity of the features
(``mean exp(-||z_i - z_j||^2 / median)`` over pairs), both over a pixel sample whose classes
weigh the same (``balance``, :mod:`fedseg.methods.balanced`). The server is FedAvg.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, PositiveInt

from fedseg.methods.alignment import AlignmentMethod, BalancedConfig, train_with_terms
from fedseg.methods.balanced import pixel_weights, sample_pixels
from fedseg.methods.base import ClientContext, ClientResult, Payload, State
from fedseg.methods.clustered_prototypes import FeatureView
from fedseg.methods.registry import register_method

__all__ = ["FedUV", "uniformity_loss", "variance_loss"]


def _uniform(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((n,), 1.0 / max(n, 1), dtype=like.dtype, device=like.device)


def variance_loss(logits: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """FedUV's variance hinge of logits ``[N, C]``: ``mean_c relu(gamma - std_n softmax_c)``
    with the ``weights``-weighted (default uniform) population std over the N samples and
    ``gamma`` the population std of the C x C identity's columns, which a confident,
    class-balanced prediction meets exactly (0 when N < 2)."""
    if len(logits) < 2:
        return logits.sum() * 0
    c = logits.shape[1]
    w = (_uniform(len(logits), logits) if weights is None else weights.to(logits))[:, None]
    gamma = math.sqrt((c - 1) / c**2)
    p = torch.softmax(logits, dim=1)
    var = (w * (p - (w * p).sum(0)).pow(2)).sum(0)
    return torch.relu(gamma - var.clamp_min(0).sqrt()).mean()


def uniformity_loss(z: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """FedUV's uniformity of embeddings ``[N, D]``: ``sum_ij w_i w_j exp(-d_ij^2 / sigma)``
    over all ordered pairs, ``i = j`` included (``weights`` default uniform, summing to 1),
    with sigma the ``w_i w_j``-weighted median of the non-zero squared distances (0 when no
    pair is apart). Repeating a row with its weight split leaves it unchanged. Computed in
    float32 (``pdist`` has no bf16 kernel; distances need the precision under autocast)."""
    z = z.float()
    n = len(z)
    w = _uniform(n, z) if weights is None else weights.to(z)
    d2 = torch.pdist(z, p=2).pow(2)  # pairs i < j, row-major
    i, j = torch.triu_indices(n, n, offset=1, device=z.device)
    pair_w = w[i] * w[j]
    apart = d2 != 0
    if not apart.any():
        return z.sum() * 0
    sigma = _weighted_median(d2[apart], pair_w[apart])
    return (w * w).sum() + 2 * (pair_w * d2.mul(-1 / sigma).exp()).sum()


def _weighted_median(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The smallest value at which the cumulative weight reaches half the total."""
    order = values.argsort()
    cum = weights[order].cumsum(0)
    k = torch.searchsorted(cum, cum[-1] / 2).clamp(max=len(values) - 1)
    return values[order[k]]


@register_method("feduv")
class FedUV(AlignmentMethod):
    """FedAvg plus FedUV's variance and uniformity regularisers on sampled pixels.

    Reference: Son, Kim, Chung, Huang and Liu, "FedUV: Uniformity and Variance for
    Heterogeneous Federated Learning", CVPR 2024.
    """

    class Config(BalancedConfig):
        """FedUV settings (see docs/methods/feduv.md)."""

        std_coeff: float = Field(2.5, ge=0)
        """Weight of the variance hinge (reference code: 2.5)."""
        unif_coeff: float = Field(0.5, ge=0)
        """Weight of the uniformity term (reference code: 0.5)."""
        unif_pixels: PositiveInt = 1024
        """Pixels of a batch whose features enter the uniformity term, at most an equal
        share per class (pdist is O(n^2))."""

    config: Config
    summary = "FedUV: FedAvg + class-probability variance hinge + feature uniformity"

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model, cfg, spec = ctx.model, self.config, ctx.spec
        self.load(model, payload, state)

        def terms(
            logits: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            k, gen = spec.num_classes, ctx.generator
            p, py = sample_pixels(logits, labels, k, cfg.pixels, gen)
            share = max(1, min(cfg.pixels, cfg.unif_pixels // k))
            z, zy = sample_pixels(feats, labels, k, share, gen)
            return {
                "var": cfg.std_coeff * variance_loss(p, pixel_weights(py, cfg.balance)),
                "unif": cfg.unif_coeff * uniformity_loss(z, pixel_weights(zy, cfg.balance)),
            }

        metrics = train_with_terms(FeatureView(model, cfg.level), ctx, terms)
        upload, private = self.split(model)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)
