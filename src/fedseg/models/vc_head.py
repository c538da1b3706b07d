"""The virtual-class cosine head (Liu, Fang, Wu, Qin, "Personalized Federated Medical Image
Segmentation via Virtual Classes", Eq. 3).

``C`` real and ``V`` virtual class vectors, initialised together as orthonormal rows; the real
rows are trained, the virtual rows are a buffer (never in an optimiser, never updated).
Logits are ``scale * cos(z, w)`` per pixel: the 1x1 convolution of the L2-normalised pixel
embedding with the L2-normalised class vectors. When ``C + V`` exceeds the embedding width
``D``, ``D`` orthonormal rows cannot hold them: a trainable 1x1 projection widens the
embedding to ``C + V`` channels first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.models.layers import conv

__all__ = ["VirtualClassHead"]


class VirtualClassHead(nn.Module):
    """Cosine head with ``num_classes`` trained real rows and ``num_virtual`` frozen rows.

    Output channels: the ``num_classes`` real logits, then the ``num_virtual`` virtual ones.
    ``proj`` is the widening 1x1 projection (``nn.Identity`` when the width suffices).
    """

    virtual: torch.Tensor

    def __init__(
        self, in_channels: int, num_classes: int, num_virtual: int, scale: float, ndim: int = 2
    ) -> None:
        super().__init__()
        if num_virtual < 1:
            raise ValueError(f"num_virtual must be >= 1, got {num_virtual}")
        rows = num_classes + num_virtual
        width = max(in_channels, rows)
        self.proj: nn.Module = (
            conv(ndim, in_channels, width, kernel_size=1) if width > in_channels else nn.Identity()
        )
        w = torch.empty(rows, width)
        nn.init.orthogonal_(w)
        self.real = nn.Parameter(w[:num_classes].clone())
        self.register_buffer("virtual", w[num_classes:].clone())
        self.num_classes, self.scale = num_classes, scale

    @property
    def width(self) -> int:
        """Width of the embedding the class vectors live in (after ``proj``)."""
        return int(self.real.shape[1])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = F.normalize(self.proj(z), dim=1)
        w = F.normalize(torch.cat([self.real, self.virtual]), dim=1)
        return self.scale * torch.einsum("bd...,kd->bk...", z, w)
