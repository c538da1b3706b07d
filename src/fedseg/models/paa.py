"""Personalized affinity aggregation (PAA) of the virtual-class paper (Eqs. 9-12).

``Q = conv_q(D)``, ``K = conv_k(E)``, ``M = conv_m(ReLU(Q + K))``, ``Z = Q * M`` with 1x1
convolutions: ``D`` is the decoder feature entering a level (already brought to the
encoder feature's grid), ``E`` the encoder feature of that level. ``Z`` is added to ``D``
(see docs/methods/fedvc.md). Parameter names ``query``, ``key``, ``modulation`` let a
partition keep the query and the modulation ("affinity matrix" projection) personal and
share the key (Eqs. 13-15).
"""

from __future__ import annotations

import torch
from torch import nn

from fedseg.models.layers import conv

__all__ = ["PAA", "PAA_PARTS"]

PAA_PARTS = ("query", "key", "modulation")
"""The three projections of a PAA module, as named in the state dict."""


class PAA(nn.Module):
    """One PAA module: ``dec_channels`` decoder channels (also the output's), keys from
    ``enc_channels`` encoder channels."""

    def __init__(self, dec_channels: int, enc_channels: int, ndim: int = 2) -> None:
        super().__init__()
        self.query = conv(ndim, dec_channels, dec_channels, kernel_size=1)
        self.key = conv(ndim, enc_channels, dec_channels, kernel_size=1)
        self.modulation = conv(ndim, dec_channels, dec_channels, kernel_size=1)

    def forward(self, dec: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        """``Z = Q * conv_m(ReLU(Q + K))`` on ``dec``'s grid (``enc`` must share it)."""
        q = self.query(dec)
        return q * self.modulation(torch.relu(q + self.key(enc)))
