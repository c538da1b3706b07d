"""FedLPPA's Tri-prompt Dual-attention Fusion (TDF) module (paper Sec. III-B, Eqs. 3-6).

At the bottleneck feature ``F`` (``[B, 256, h, w]``) the module concatenates three prompts:

- UKP, the universal knowledge prompt ``[1, h, w]``: learnable, shared by all sites;
- DDP, the data distribution prompts ``[N, h, w]``: learnable, site ``i`` uses slot ``i``;
- ASP, the annotation sparsity prompt ``[3, h, w]``: fixed one-hot planes
  (sparse = point, medium = scribble, dense = block; full masks give all zeros).

``cat(F, DDP_i, UKP, ASP)`` passes two conv blocks (to 128, then 64 channels) giving
``F^``, which spatial and channel attention enhance (Eq. 5, learnable gammas initialised
to 0). The module returns ``F~`` (64 channels); the network concatenates it with ``F``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from fedseg.models.layers import batch_norm, conv, dropout

__all__ = [
    "ASP_LEVELS",
    "TDF",
    "ChannelAttention",
    "Fusion",
    "SpatialAttention",
    "asp_planes",
    "prompt_affinity",
]

Fusion = Literal["none", "channel", "spatial", "dual"]
ASP_LEVELS = ("sparse", "medium", "dense")
"""Order of the three ASP planes."""


def asp_planes(sparsity: str | None) -> torch.Tensor:
    """One-hot ``[3]`` vector of ``sparsity`` over :data:`ASP_LEVELS` (``None``: zeros)."""
    out = torch.zeros(len(ASP_LEVELS))
    if sparsity is not None:
        if sparsity not in ASP_LEVELS:
            raise ValueError(f"sparsity must be one of {ASP_LEVELS} or None, got {sparsity!r}")
        out[ASP_LEVELS.index(sparsity)] = 1.0
    return out


def prompt_affinity(ddp: torch.Tensor, ukp: torch.Tensor | None) -> torch.Tensor:
    """Eqs. 7-8: ``a_ij = ReLU(cos(cat(UKP, DDP_i), cat(UKP, DDP_j)))`` as an ``[N, N]`` matrix.

    Without a UKP (prompt ablation) the DDP slots alone are compared.
    """
    vec = ddp.detach().double().flatten(1)
    if ukp is not None:
        vec = torch.cat([ukp.detach().double().flatten().expand(len(vec), -1), vec], dim=1)
    unit = torch.nn.functional.normalize(vec, dim=1)
    return (unit @ unit.T).clamp(min=0.0).float()


def _conv_k(ndim: int, cin: int, cout: int, kernel: tuple[int, ...]) -> nn.Module:
    cls = nn.Conv2d if ndim == 2 else nn.Conv3d
    return cls(cin, cout, kernel, padding=tuple(k // 2 for k in kernel))


class SpatialAttention(nn.Module):
    """Position attention (Eq. 3): ``out = gamma * V S^T + x``, ``S = softmax_i(Q_i^T K_j)``.

    Query and key are 8-channel projections with 1x3 and 3x1 kernels (+BN+ReLU), the value a
    1x1 convolution; ``gamma`` starts at 0.
    """

    def __init__(self, ndim: int, channels: int, inner: int = 8) -> None:
        super().__init__()
        row = (1,) * (ndim - 1) + (3,)
        col = (3,) + (1,) * (ndim - 1)
        self.query = nn.Sequential(
            _conv_k(ndim, channels, inner, row), batch_norm(ndim, inner), nn.ReLU()
        )
        self.key = nn.Sequential(
            _conv_k(ndim, channels, inner, col), batch_norm(ndim, inner), nn.ReLU()
        )
        self.value = conv(ndim, channels, channels, kernel_size=1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def enhanced(self, x: torch.Tensor) -> torch.Tensor:
        """``F_s``: the attention-weighted values, before scaling by gamma."""
        q = self.query(x).flatten(2)  # [B, d, HW]
        k = self.key(x).flatten(2)
        v = self.value(x).flatten(2)  # [B, C, HW]
        attn = torch.softmax(torch.bmm(k.transpose(1, 2), q), dim=-1)  # [B, j, i]
        return torch.bmm(v, attn.transpose(1, 2)).view_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * self.enhanced(x) + x


class ChannelAttention(nn.Module):
    """Channel attention (Eq. 4): ``out = gamma * C V' + x``, ``C = softmax_i(X_j . X_i)``."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1))

    def enhanced(self, x: torch.Tensor) -> torch.Tensor:
        """``F_c``: channels re-mixed by their affinity, before scaling by gamma."""
        flat = x.flatten(2)  # [B, C, HW]
        attn = torch.softmax(torch.bmm(flat, flat.transpose(1, 2)), dim=-1)  # [B, j, i]
        return torch.bmm(attn, flat).view_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * self.enhanced(x) + x


class TDF(nn.Module):
    """Prompts + fusion convolutions + dual attention; returns the 64-channel ``F~``.

    Args:
        ndim: 2 or 3.
        in_channels: channels of the bottleneck feature ``F``.
        prompt_shape: spatial shape of ``F`` (and so of every prompt plane).
        num_sites: number of DDP slots.
        ukp, asp: include the UKP / the ASP planes (DDP is always used).
        fusion: ``none``, ``channel``, ``spatial`` or ``dual`` (Eq. 5: both, summed).
        mid_channels, out_channels: widths of the two fusion conv blocks (128, 64).
        dropout_p: dropout after the first fusion block (0.5 as in the authors' network).
    """

    def __init__(
        self,
        ndim: int,
        in_channels: int,
        prompt_shape: Sequence[int],
        num_sites: int,
        *,
        ukp: bool = True,
        asp: bool = True,
        fusion: Fusion = "dual",
        mid_channels: int = 128,
        out_channels: int = 64,
        dropout_p: float = 0.5,
    ) -> None:
        super().__init__()
        if fusion not in ("none", "channel", "spatial", "dual"):
            raise ValueError(f"fusion must be none/channel/spatial/dual, got {fusion!r}")
        if len(prompt_shape) != ndim or num_sites < 1:
            raise ValueError(
                f"prompt_shape needs {ndim} sizes and num_sites >= 1, got {tuple(prompt_shape)} "
                f"and {num_sites}"
            )
        self.fusion, self.use_asp, self.prompt_shape = fusion, asp, tuple(prompt_shape)
        self.ddp = nn.Parameter(torch.rand(num_sites, *prompt_shape))
        self.ukp = nn.Parameter(torch.rand(1, *prompt_shape)) if ukp else None
        self.register_buffer("asp", torch.zeros(len(ASP_LEVELS)), persistent=False)
        self.site = 0
        cin = in_channels + 1 + int(ukp) + (len(ASP_LEVELS) if asp else 0)
        self.fuse = nn.Sequential(
            conv(ndim, cin, mid_channels),
            batch_norm(ndim, mid_channels),
            nn.LeakyReLU(),
            dropout(ndim, dropout_p),
            conv(ndim, mid_channels, out_channels),
            batch_norm(ndim, out_channels),
            nn.LeakyReLU(),
        )
        self.spatial = (
            SpatialAttention(ndim, out_channels) if fusion in ("spatial", "dual") else None
        )
        self.channel = ChannelAttention() if fusion in ("channel", "dual") else None

    def set_site(self, index: int, sparsity: str | None) -> None:
        """Select DDP slot ``index`` and the ASP of ``sparsity`` for the following forwards."""
        if not 0 <= index < self.ddp.shape[0]:
            raise ValueError(f"site index must lie in [0, {self.ddp.shape[0]}), got {index}")
        self.site = index
        self.asp.copy_(asp_planes(sparsity))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        if tuple(feat.shape[2:]) != self.prompt_shape:
            raise ValueError(
                f"TDF prompts are {self.prompt_shape} but the bottleneck feature is "
                f"{tuple(feat.shape[2:])}: inputs must have the federation's image size"
            )
        b = feat.shape[0]
        planes = [self.ddp[self.site : self.site + 1]]
        if self.ukp is not None:
            planes.append(self.ukp)
        if self.use_asp:
            view = (len(ASP_LEVELS),) + (1,) * len(self.prompt_shape)
            planes.append(self.asp.view(view).expand(-1, *self.prompt_shape))
        prompt = torch.cat(planes).unsqueeze(0).expand(b, *[-1] * (feat.ndim - 1))
        fused = self.fuse(torch.cat([feat, prompt.to(feat.dtype)], dim=1))
        out = []
        if self.spatial is not None:
            out.append(self.spatial(fused))  # gamma_s F_s + F^
        if self.channel is not None:
            out.append(self.channel(fused))  # gamma_c F_c + F^
        return sum(out[1:], out[0]) if out else fused
