"""The PyMIC/WSL4MIS-style UNet used by FedLPPA and its baselines, in 2D or 3D.

With 1 input channel and 2 classes the 2D network has 1,813,474 trainable parameters
(FedLPPA paper, Table IX: 1.8135M).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.models.layers import batch_norm, conv, dropout, max_pool, upsample_mode

__all__ = ["ConvBlock", "Decoder", "Encoder", "UNet", "UNetOutput", "UpBlock"]

CHANNELS = (16, 32, 64, 128, 256)
DROPOUT = (0.05, 0.1, 0.2, 0.3, 0.5)


class ConvBlock(nn.Sequential):
    """conv3 - BN - LeakyReLU - Dropout - conv3 - BN - LeakyReLU."""

    def __init__(self, ndim: int, in_ch: int, out_ch: int, p: float) -> None:
        super().__init__(
            conv(ndim, in_ch, out_ch),
            batch_norm(ndim, out_ch),
            nn.LeakyReLU(),
            dropout(ndim, p),
            conv(ndim, out_ch, out_ch),
            batch_norm(ndim, out_ch),
            nn.LeakyReLU(),
        )


class Encoder(nn.Module):
    """Five ConvBlocks separated by max pooling; returns the feature of every level."""

    def __init__(
        self,
        in_channels: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        dropout_p: Sequence[float] = DROPOUT,
    ) -> None:
        super().__init__()
        self.pool = max_pool(ndim)
        chans = [in_channels, *channels]
        self.blocks = nn.ModuleList(
            ConvBlock(ndim, chans[i], chans[i + 1], dropout_p[i]) for i in range(len(channels))
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for i, block in enumerate(self.blocks):
            x = block(x if i == 0 else self.pool(x))
            feats.append(x)
        return feats


class UpBlock(nn.Module):
    """conv1x1 - x2 interpolation - concat with the skip feature - ConvBlock."""

    def __init__(self, ndim: int, in_ch: int, skip_ch: int, out_ch: int, p: float = 0.0) -> None:
        super().__init__()
        self.mode = upsample_mode(ndim)
        self.reduce = conv(ndim, in_ch, skip_ch, kernel_size=1)
        self.conv = ConvBlock(ndim, 2 * skip_ch, out_ch, p)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(self.reduce(x), size=skip.shape[2:], mode=self.mode, align_corners=True)
        return self.conv(torch.cat([skip, x], dim=1))


class Decoder(nn.Module):
    """Four UpBlocks and a conv3 head; ``bottleneck_channels`` lets add-ons widen the input."""

    def __init__(
        self,
        num_classes: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        bottleneck_channels: int | None = None,
    ) -> None:
        super().__init__()
        bottom = bottleneck_channels or channels[-1]
        ins = [bottom, *reversed(channels[1:-1])]
        skips = list(reversed(channels[:-1]))
        self.ups = nn.ModuleList(UpBlock(ndim, i, s, s) for i, s in zip(ins, skips, strict=True))
        self.head = conv(ndim, channels[0], num_classes)

    def features(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Decoder features from the deepest to the last (full-resolution) one."""
        x = feats[-1]
        out = []
        for up, skip in zip(self.ups, reversed(feats[:-1]), strict=True):
            x = up(x, skip)
            out.append(x)
        return out

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.head(self.features(feats)[-1])


@dataclass
class UNetOutput:
    """Logits plus the multi-level features that prototype and prompt methods need."""

    logits: torch.Tensor
    encoder: list[torch.Tensor]
    decoder: list[torch.Tensor]


class UNet(nn.Module):
    """Encoder-decoder UNet; ``ndim`` selects 2D or 3D layers from the same code.

    Example:
        >>> net = UNet(in_channels=1, num_classes=2)
        >>> sum(p.numel() for p in net.parameters())
        1813474
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        dropout_p: Sequence[float] = DROPOUT,
    ) -> None:
        super().__init__()
        if len(channels) != len(dropout_p):
            raise ValueError(
                f"channels and dropout_p need the same length, got {len(channels)} and "
                f"{len(dropout_p)}"
            )
        self.ndim = ndim
        self.encoder = Encoder(in_channels, ndim, channels, dropout_p)
        self.decoder = Decoder(num_classes, ndim, channels)

    def forward_features(self, x: torch.Tensor) -> UNetOutput:
        """Run the network and keep every encoder and decoder feature."""
        enc = self.encoder(x)
        dec = self.decoder.features(enc)
        return UNetOutput(self.decoder.head(dec[-1]), enc, dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))
