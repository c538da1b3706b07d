"""The virtual-class paper's networks: a UNet or PVTv2-b0 + FPN backbone with personalized
affinity aggregation (PAA) in the decoder and the virtual-class cosine head.

UNet (:class:`PAAUNet`): one PAA module per up-block, ``paa.{i}`` for ``decoder.ups.{i}``.
``D`` is the coarser decoder feature after the block's 1x1 reduction and bilinear
up-sampling to the skip's grid, ``E`` the skip (encoder) feature; ``D + Z`` is concatenated
with the skip as usual. FPN (:class:`~fedseg.models.fpn.PVTv2FPN` with ``paa=True``): one
per top-down step, ``D`` the up-sampled coarser level, ``E`` the raw encoder feature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.errors import ConfigError
from fedseg.models.layers import Norm
from fedseg.models.paa import PAA
from fedseg.models.unet import CHANNELS, DROPOUT, UNet, UNetOutput
from fedseg.models.vc_head import VirtualClassHead

__all__ = ["PAAUNet", "attach_virtual_head"]


class PAAUNet(UNet):
    """The UNet with a PAA module in every up-block (none when ``paa`` is false: the plain
    UNet, same parameters and outputs)."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
        paa: bool = True,
    ) -> None:
        super().__init__(
            in_channels, num_classes, ndim, channels, dropout_p, norm_kind, head_kernel
        )
        skips = [up.reduce.out_channels for up in self.decoder.ups]
        self.paa = nn.ModuleList(PAA(c, c, ndim) for c in skips) if paa else nn.ModuleList()

    def forward_features(self, x: torch.Tensor) -> UNetOutput:
        if not len(self.paa):
            return super().forward_features(x)
        enc = self.encode(x)
        h, dec = enc[-1], []
        for up, skip, paa in zip(self.decoder.ups, reversed(enc[:-1]), self.paa, strict=True):
            d = F.interpolate(up.reduce(h), size=skip.shape[2:], mode=up.mode, align_corners=True)
            h = up.conv(torch.cat([skip, d + paa(d, skip)], dim=1))
            dec.append(h)
        return UNetOutput(self.decoder.head(dec[-1]), enc, dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x).logits


def attach_virtual_head(
    net: nn.Module, num_classes: int, num_virtual: int, scale: float, ndim: int = 2
) -> VirtualClassHead:
    """Replace ``net.decoder.head`` (a convolution) by a :class:`VirtualClassHead` reading
    the same features; returns the new head."""
    old = getattr(getattr(net, "decoder", None), "head", None)
    if not isinstance(old, nn.Conv2d | nn.Conv3d):
        raise ConfigError(
            f"model.name: {type(net).__name__} has no convolutional decoder.head to replace "
            "with the virtual-class head"
        )
    head = VirtualClassHead(old.in_channels, num_classes, num_virtual, scale, ndim)
    net.decoder.head = head  # type: ignore[union-attr]
    return head
