"""FedUV (Son et al., CVPR 2024): uniformity and variance regularisers for local training.

Local training adds ``std_coeff * L_var + unif_coeff * L_unif``: a hinge that keeps the
per-class standard deviation of the predicted probabilities across samples at least that of
the identity matrix's columns (so predictions do not collapse to one class, emulating an
IID batch), and the hyperspherical uniformity of the features
(``mean exp(-||z_i - z_j||^2 / median)`` over pairs). The server is FedAvg.
"""

from __future__ import annotations

import torch
from pydantic import Field, PositiveInt

from fedseg.methods.alignment import (
    AlignmentConfig,
    AlignmentMethod,
    random_pixels,
    train_with_terms,
)
from fedseg.methods.base import ClientContext, ClientResult, Payload, State
from fedseg.methods.clustered_prototypes import FeatureView, sample_pixels
from fedseg.methods.registry import register_method

__all__ = ["FedUV", "uniformity_loss", "variance_loss"]


def variance_loss(logits: torch.Tensor) -> torch.Tensor:
    """FedUV's variance hinge of logits ``[N, C]``: ``mean_c relu(gamma - std_n softmax_c)``
    with the unbiased std over the N samples and ``gamma = 1 / sqrt(C)``, the mean column std
    of the C x C identity (0 when N < 2)."""
    if len(logits) < 2:
        return logits.sum() * 0
    c = logits.shape[1]
    gamma = torch.eye(c).std(dim=0).mean().item()
    std = torch.softmax(logits, dim=1).std(dim=0)
    return torch.relu(gamma - std).mean()


def uniformity_loss(z: torch.Tensor) -> torch.Tensor:
    """FedUV's uniformity of embeddings ``[N, D]``: ``mean exp(-d_ij^2 / sigma)`` over pairs,
    with sigma the median of the non-zero squared pairwise distances (0 when no pair is
    apart)."""
    d2 = torch.pdist(z, p=2).pow(2)
    apart = d2[d2 != 0]
    if len(apart) == 0:
        return z.sum() * 0
    return d2.mul(-1 / torch.median(apart)).exp().mean()


@register_method("feduv")
class FedUV(AlignmentMethod):
    """FedAvg plus FedUV's variance and uniformity regularisers on sampled pixels.

    Reference: Son, Kim, Chung, Huang and Liu, "FedUV: Uniformity and Variance for
    Heterogeneous Federated Learning", CVPR 2024.
    """

    class Config(AlignmentConfig):
        """FedUV settings (see docs/methods/feduv.md)."""

        std_coeff: float = Field(2.5, ge=0)
        """Weight of the variance hinge (reference code: 2.5)."""
        unif_coeff: float = Field(0.5, ge=0)
        """Weight of the uniformity term (reference code: 0.5)."""
        unif_pixels: PositiveInt = 1024
        """Pixels of a batch whose features enter the uniformity term (pdist is O(n^2))."""

    config: Config
    summary = "FedUV: FedAvg + class-probability variance hinge + feature uniformity"

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model, cfg, spec = ctx.model, self.config, ctx.spec
        self.load(model, payload, state)

        def terms(
            logits: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            k, cap, gen = spec.num_classes, cfg.pixels, ctx.generator
            p, _ = sample_pixels(logits, labels, k, cap, gen)
            z, _ = sample_pixels(feats, labels, k, cap, gen)
            z = z[random_pixels(len(z), cfg.unif_pixels, gen, z.device)]
            return {
                "var": cfg.std_coeff * variance_loss(p),
                "unif": cfg.unif_coeff * uniformity_loss(z),
            }

        metrics = train_with_terms(FeatureView(model, cfg.level), ctx, terms)
        upload, private = self.split(model)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)
