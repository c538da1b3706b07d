"""The PyMIC/WSL4MIS-style UNet used by FedLPPA and its baselines, in 2D or 3D.

With 1 input channel and 2 classes the 2D network has 1,813,474 trainable parameters
(FedLPPA paper, Table IX: 1.8135M).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import PositiveInt, model_validator
from torch import nn

from fedseg.models.layers import Norm, conv, dropout, max_pool, norm, upsample_mode
from fedseg.models.registry import ModelConfig, register_model

__all__ = [
    "ConvBlock",
    "Decoder",
    "Encoder",
    "UNet",
    "UNetConfig",
    "UNetOutput",
    "UpBlock",
    "level_names",
]

CHANNELS = (16, 32, 64, 128, 256)
DROPOUT = (0.05, 0.1, 0.2, 0.3, 0.5)
Activation = Literal["leaky_relu", "relu"]
Upsample = Literal["interp", "transpose"]
ACTIVATIONS: dict[str, type[nn.Module]] = {"leaky_relu": nn.LeakyReLU, "relu": nn.ReLU}


class ConvBlock(nn.Sequential):
    """conv3 - norm - LeakyReLU - Dropout - conv3 - norm - LeakyReLU (norm: BN by default;
    ``act="relu"`` and ``bias=False`` give HarmoFL's block)."""

    def __init__(
        self,
        ndim: int,
        in_ch: int,
        out_ch: int,
        p: float,
        norm_kind: Norm = "batch",
        act: Activation = "leaky_relu",
        bias: bool = True,
    ) -> None:
        super().__init__(
            conv(ndim, in_ch, out_ch, bias=bias),
            norm(ndim, out_ch, norm_kind),
            ACTIVATIONS[act](),
            dropout(ndim, p),
            conv(ndim, out_ch, out_ch, bias=bias),
            norm(ndim, out_ch, norm_kind),
            ACTIVATIONS[act](),
        )


class Encoder(nn.Module):
    """Five ConvBlocks separated by max pooling; returns the feature of every level.

    ``post`` (empty by default) maps a level name (``enc2``, ...) to a module applied to that
    level's output, which then feeds both the next level and the skip connection (e.g.
    FedBCS's frequency-domain style recalibration).
    """

    def __init__(
        self,
        in_channels: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        act: Activation = "leaky_relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.pool = max_pool(ndim)
        chans = [in_channels, *channels]
        self.blocks = nn.ModuleList(
            ConvBlock(ndim, chans[i], chans[i + 1], dropout_p[i], norm_kind, act, bias)
            for i in range(len(channels))
        )
        self.post = nn.ModuleDict()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for i, block in enumerate(self.blocks):
            x = block(x if i == 0 else self.pool(x))
            if f"enc{i + 1}" in self.post:
                x = self.post[f"enc{i + 1}"](x)
            feats.append(x)
        return feats


class UpBlock(nn.Module):
    """conv1x1 - x2 interpolation - concat with the skip feature - ConvBlock.

    ``upsample="transpose"`` replaces conv1x1 + interpolation by a 2x2 stride-2 transposed
    convolution (HarmoFL's UNet; interpolated only if the sizes still differ)."""

    def __init__(
        self,
        ndim: int,
        in_ch: int,
        skip_ch: int,
        out_ch: int,
        p: float = 0.0,
        norm_kind: Norm = "batch",
        act: Activation = "leaky_relu",
        bias: bool = True,
        upsample: Upsample = "interp",
    ) -> None:
        super().__init__()
        self.mode = upsample_mode(ndim)
        self.transpose = upsample == "transpose"
        if self.transpose:
            cls = nn.ConvTranspose2d if ndim == 2 else nn.ConvTranspose3d
            self.reduce: nn.Module = cls(in_ch, skip_ch, kernel_size=2, stride=2)
        else:
            self.reduce = conv(ndim, in_ch, skip_ch, kernel_size=1)
        self.conv = ConvBlock(ndim, 2 * skip_ch, out_ch, p, norm_kind, act, bias)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.reduce(x)
        if not self.transpose or x.shape[2:] != skip.shape[2:]:
            x = F.interpolate(x, size=skip.shape[2:], mode=self.mode, align_corners=True)
        return self.conv(torch.cat([skip, x], dim=1))


class Decoder(nn.Module):
    """UpBlocks and a conv head (3x3 by default); ``bottleneck_channels`` lets add-ons widen
    the input."""

    def __init__(
        self,
        num_classes: int,
        ndim: int = 2,
        channels: Sequence[int] = CHANNELS,
        bottleneck_channels: int | None = None,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
        act: Activation = "leaky_relu",
        bias: bool = True,
        upsample: Upsample = "interp",
    ) -> None:
        super().__init__()
        bottom = bottleneck_channels or channels[-1]
        ins = [bottom, *reversed(channels[1:-1])]
        skips = list(reversed(channels[:-1]))
        self.ups = nn.ModuleList(
            UpBlock(ndim, i, s, s, 0.0, norm_kind, act, bias, upsample)
            for i, s in zip(ins, skips, strict=True)
        )
        self.head = conv(ndim, channels[0], num_classes, kernel_size=head_kernel)

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


def level_names(levels: int) -> tuple[list[str], list[str]]:
    """Names of a ``levels``-deep UNet's features: ``enc1`` (full resolution) ... ``enc<L>``
    (the bottleneck) and ``dec<L-1>`` ... ``dec1`` (decoder outputs, ``dec<k>`` at the
    resolution of ``enc<k>``), in the order the network computes them."""
    return [f"enc{i + 1}" for i in range(levels)], [f"dec{i}" for i in range(levels - 1, 0, -1)]


@dataclass
class UNetOutput:
    """Logits plus the multi-level features that prototype and prompt methods need."""

    logits: torch.Tensor
    encoder: list[torch.Tensor]
    decoder: list[torch.Tensor]

    @property
    def features(self) -> dict[str, torch.Tensor]:
        """Every feature by name (see :func:`level_names`)."""
        enc, dec = level_names(len(self.encoder))
        return dict(zip(enc + dec, self.encoder + self.decoder, strict=True))


class UNet(nn.Module):
    """Encoder-decoder UNet; ``ndim`` selects 2D or 3D layers from the same code.

    ``act``, ``conv_bias`` and ``upsample`` select HarmoFL's variant (ReLU, bias-free 3x3
    convolutions, transposed-convolution upsampling; see ``harmofl_unet``).

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
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
        act: Activation = "leaky_relu",
        conv_bias: bool = True,
        upsample: Upsample = "interp",
    ) -> None:
        super().__init__()
        if len(channels) != len(dropout_p):
            raise ValueError(
                f"channels and dropout_p need the same length, got {len(channels)} and "
                f"{len(dropout_p)}"
            )
        self.ndim = ndim
        self.encoder = Encoder(in_channels, ndim, channels, dropout_p, norm_kind, act, conv_bias)
        self.decoder = Decoder(
            num_classes, ndim, channels, None, norm_kind, head_kernel, act, conv_bias, upsample
        )

    def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The encoder features ``enc1`` ... ``enc<L>`` (a subclass may transform them)."""
        return self.encoder(x)

    def forward_features(self, x: torch.Tensor) -> UNetOutput:
        """Run the network and keep every encoder and decoder feature."""
        enc = self.encode(x)
        dec = self.decoder.features(enc)
        return UNetOutput(self.decoder.head(dec[-1]), enc, dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encode(x))


@register_model("unet")
class UNetConfig(ModelConfig):
    """The PyMIC/WSL4MIS UNet (default) and its variants, e.g. HarmoFL's normalisation.

    ``widths`` are the channels per level (the last one is the bottleneck), ``dropout`` the
    dropout probability per level (same length), ``norm`` the normalisation of every conv
    block, ``head_kernel`` the size of the output convolution (3, or 1 as HarmoFL/FedBCS).
    """

    name: Literal["unet"] = "unet"
    widths: tuple[PositiveInt, ...] = CHANNELS
    dropout: tuple[float, ...] = DROPOUT
    norm: Norm = "batch"
    head_kernel: Literal[1, 3] = 3

    @model_validator(mode="after")
    def _same_length(self) -> UNetConfig:
        if len(self.widths) != len(self.dropout):
            raise ValueError(
                f"widths and dropout need the same length, got {len(self.widths)} and "
                f"{len(self.dropout)}"
            )
        if len(self.widths) < 2:
            raise ValueError(f"widths needs at least 2 levels, got {list(self.widths)}")
        if any(not 0 <= p < 1 for p in self.dropout):
            raise ValueError(f"dropout values must be in [0, 1), got {list(self.dropout)}")
        return self

    def unet_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`UNet` (and of networks built from its parts)."""
        return {
            "channels": self.widths,
            "dropout_p": self.dropout,
            "norm_kind": self.norm,
            "head_kernel": self.head_kernel,
        }

    def build(self, in_channels: int, num_classes: int, ndim: int) -> nn.Module:
        return UNet(in_channels, num_classes, ndim, **self.unet_kwargs())
