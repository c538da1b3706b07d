"""SynergyNet (Gorade et al., WACV 2024) as reconstructed for the pancreas paper's 3D runs.

A UNet encoder-decoder whose bottleneck feature ``z_e`` passes through a synergy block:
a discrete branch (1x1 projection, :class:`~fedseg.models.vq.VectorQuantizer` with the
straight-through estimator), a continuous branch (``z_e``, optionally refined by a residual
conv block), and ``layers`` pre-LN transformer layers of ``heads`` heads over the joint
sequence [continuous tokens; discrete tokens] ("8s2h": 8 layers, 2 heads). The continuous
half of the output is concatenated with ``z_e`` and reduced by a 1x1 conv for the decoder.
No code of the paper is public: every choice is a setting, documented in
``docs/methods/synergynet.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt, model_validator
from torch import nn

from fedseg.errors import ConfigError
from fedseg.models.layers import Norm, conv, upsample_mode
from fedseg.models.registry import register_model
from fedseg.models.unet import (
    CHANNELS,
    DROPOUT,
    ConvBlock,
    UNet,
    UNetConfig,
)
from fedseg.models.vq import VectorQuantizer

__all__ = ["SynergyBlock", "SynergyNet", "SynergyNetConfig"]


class SynergyBlock(nn.Module):
    """The bottleneck: discrete and continuous latents fused by self-attention.

    Args:
        ndim: 2 or 3.
        channels: C, the width of ``z_e`` and of the attention tokens.
        codebook_size: K codes.
        code_dim: D, the quantised dimension (None: C, and no projection back).
        beta: commitment weight of the VQ loss.
        vq_weight: lambda_vq, the weight of the VQ loss in the training loss.
        layers: S transformer layers.
        heads: h attention heads per layer.
        mlp_ratio: hidden width of the transformer MLP, in multiples of C.
        pos_grid: side of the learned positional-embedding grid, interpolated to the
            bottleneck's token grid.
        continuous_block: refine the continuous branch with a residual conv block.
        norm_kind: normalisation of that conv block.
    """

    def __init__(
        self,
        ndim: int,
        channels: int,
        *,
        codebook_size: int = 512,
        code_dim: int | None = None,
        beta: float = 0.25,
        vq_weight: float = 1.0,
        layers: int = 8,
        heads: int = 2,
        mlp_ratio: int = 4,
        pos_grid: int = 8,
        continuous_block: bool = False,
        norm_kind: Norm = "batch",
    ) -> None:
        super().__init__()
        c, d = channels, code_dim or channels
        self.ndim = ndim
        self.project = conv(ndim, c, d, kernel_size=1)
        self.quantizer = VectorQuantizer(codebook_size, d, beta, vq_weight)
        self.unproject = conv(ndim, d, c, kernel_size=1) if d != c else nn.Identity()
        self.continuous = ConvBlock(ndim, c, c, 0.0, norm_kind) if continuous_block else None
        self.pos = nn.Parameter(torch.zeros(1, c, *[pos_grid] * ndim))
        self.branch = nn.Parameter(torch.zeros(2, c))
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.trunc_normal_(self.branch, std=0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                c,
                heads,
                mlp_ratio * c,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(c)
        self.fuse = conv(ndim, 2 * c, c, kernel_size=1)

    def _tokens(self, x: torch.Tensor, pos: torch.Tensor, branch: int) -> torch.Tensor:
        return (x + pos).flatten(2).transpose(1, 2) + self.branch[branch]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        grid = z.shape[2:]
        pos = self.pos
        if pos.shape[2:] != grid:
            pos = F.interpolate(pos, size=grid, mode=upsample_mode(self.ndim), align_corners=False)
        cont = z if self.continuous is None else z + self.continuous(z)
        disc = self.unproject(self.quantizer(self.project(z)))
        seq = torch.cat([self._tokens(cont, pos, 0), self._tokens(disc, pos, 1)], dim=1)
        for layer in self.layers:
            seq = layer(seq)
        n = cont[0, 0].numel()
        fused = self.norm(seq[:, :n]).transpose(1, 2).reshape(z.shape)
        return self.fuse(torch.cat([z, fused], dim=1))


class SynergyNet(UNet):
    """UNet encoder, :class:`SynergyBlock` bottleneck, UNet decoder (2D or 3D).

    ``private_keys`` (read by :class:`~fedseg.methods.partition.Partition`) lists the
    state-dict patterns that stay on the site whatever the method: the codebook with
    ``codebook="private"``.
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
        codebook: Literal["shared", "private"] = "shared",
        **synergy: Any,
    ) -> None:
        super().__init__(
            in_channels, num_classes, ndim, channels, dropout_p, norm_kind, head_kernel
        )
        self.synergy = SynergyBlock(ndim, channels[-1], norm_kind=norm_kind, **synergy)
        self.private_keys: tuple[str, ...] = (
            ("synergy.quantizer.codebook.*",) if codebook == "private" else ()
        )

    def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The UNet's encoder features with the bottleneck (``enc<L>``) fused by the block."""
        feats = self.encoder(x)
        return [*feats[:-1], self.synergy(feats[-1])]


@register_model("synergynet")
class SynergyNetConfig(UNetConfig):
    """SynergyNet-<layers>s<heads>h on the UNet backbone (``widths``, ``dropout``, ``norm``,
    ``head_kernel`` as ``unet``); defaults: 8 layers, 2 heads, 512 codes.

    ``codebook_size`` K, ``code_dim`` D (None: the bottleneck width), ``beta`` commitment
    weight, ``vq_weight`` lambda_vq, ``layers`` S, ``heads`` h, ``mlp_ratio``, ``pos_grid``
    (learned positional-embedding side), ``continuous_block`` (residual conv block on the
    continuous branch), ``codebook`` (``shared``: aggregated like every weight; ``private``:
    each site keeps its own).
    """

    name: Literal["synergynet"] = "synergynet"  # type: ignore[assignment]
    codebook_size: PositiveInt = 512
    code_dim: PositiveInt | None = None
    beta: float = Field(0.25, ge=0)
    vq_weight: float = Field(1.0, ge=0)
    layers: PositiveInt = 8
    heads: PositiveInt = 2
    mlp_ratio: PositiveInt = 4
    pos_grid: PositiveInt = 8
    continuous_block: bool = False
    codebook: Literal["shared", "private"] = "shared"

    @model_validator(mode="after")
    def _heads_divide_width(self) -> SynergyNetConfig:
        if self.widths[-1] % self.heads:
            raise ValueError(
                f"heads ({self.heads}) must divide the bottleneck width widths[-1] "
                f"({self.widths[-1]})"
            )
        return self

    def unet_kwargs(self) -> dict[str, Any]:
        """Refused: a method that builds its own UNet-based network cannot take SynergyNet."""
        raise ConfigError(
            "model.name: synergynet replaces the UNet bottleneck; this method builds its own "
            "UNet-based network and needs model.name unet"
        )

    def synergy_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`SynergyBlock`."""
        keys = ("codebook_size", "code_dim", "beta", "vq_weight", "layers", "heads")
        keys += ("mlp_ratio", "pos_grid", "continuous_block")
        return {k: getattr(self, k) for k in keys}

    def build(self, in_channels: int, num_classes: int, ndim: int) -> nn.Module:
        return SynergyNet(
            in_channels,
            num_classes,
            ndim,
            **UNetConfig.unet_kwargs(self),
            codebook=self.codebook,
            **self.synergy_kwargs(),
        )
