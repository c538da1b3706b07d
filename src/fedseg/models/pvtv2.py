"""PVTv2-b0 (Wang et al., "PVT v2", CVM 2022) in plain PyTorch: the encoder of FedDP's and
the virtual-class paper's "PVTv2 + FPN" backbone.

Module and state-dict names are written after timm's ``pvt_v2_b0`` (``stages.{i}.downsample``,
``stages.{i}.blocks.{j}.attn.q`` ...), and FedDP's ``.q.`` filter finds the attention queries.
With 3 input channels the encoder has 3,409,760 parameters, timm's ``pvt_v2_b0`` without its
1000-class head. :func:`convert_pvtv2_state_dict` maps timm-named and original (whai362/PVT,
``patch_embed1``/``block1``/``norm1``) key names to these names and drops the ImageNet
classifier. Loading is tested only with synthetic state dicts built from this module under
those names (``tests/models/test_pvtv2.py``); no real timm or whai362 checkpoint has been
loaded or compared (none can be downloaded here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "B0",
    "PVTv2",
    "PVTv2Settings",
    "convert_pvtv2_state_dict",
]

LN_EPS = 1e-6
"""LayerNorm epsilon of the original PVTv2 and FedDP's copy (timm's default is 1e-5)."""


@dataclass(frozen=True)
class PVTv2Settings:
    """Per-stage widths, heads, MLP ratios, depths and spatial-reduction ratios."""

    dims: tuple[int, ...]
    heads: tuple[int, ...]
    mlp_ratios: tuple[int, ...]
    depths: tuple[int, ...]
    sr_ratios: tuple[int, ...]


B0 = PVTv2Settings(
    dims=(32, 64, 160, 256),
    heads=(1, 2, 5, 8),
    mlp_ratios=(8, 8, 4, 4),
    depths=(2, 2, 2, 2),
    sr_ratios=(8, 4, 2, 1),
)
"""The b0 variant (timm ``pvt_v2_b0``)."""


class DropPath(nn.Module):
    """Stochastic depth: drop the residual branch of whole samples with probability ``p``."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class OverlapPatchEmbed(nn.Module):
    """Strided convolution with overlapping windows, then LayerNorm over channels."""

    def __init__(self, in_ch: int, dim: int, patch: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_ch, dim, patch, stride, padding=patch // 2)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> ``[B, dim, H', W']`` (normalised per position)."""
        x = self.proj(x)
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class SpatialReductionAttention(nn.Module):
    """Multi-head attention whose keys/values come from a ``sr``-times reduced grid."""

    def __init__(self, dim: int, heads: int, sr: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sr_ratio = sr
        if sr > 1:
            self.sr = nn.Conv2d(dim, dim, sr, sr)
            self.norm = nn.LayerNorm(dim, eps=LN_EPS)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
        src = x
        if self.sr_ratio > 1:
            grid = x.transpose(1, 2).reshape(b, c, h, w)
            src = self.norm(self.sr(grid).flatten(2).transpose(1, 2))
        kv = self.kv(src).reshape(b, -1, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class DepthwiseMlp(nn.Module):
    """fc1 - 3x3 depth-wise conv on the token grid - GELU - fc2."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.fc1(x)
        b, _, c = x.shape
        x = self.dwconv(x.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)
        return self.fc2(self.act(x))


class Block(nn.Module):
    """Pre-norm transformer block: attention and depth-wise MLP, each with stochastic depth."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, sr: int, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.attn = SpatialReductionAttention(dim, heads, sr)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)
        self.mlp = DepthwiseMlp(dim, dim * mlp_ratio)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), h, w))
        return x + self.drop_path(self.mlp(self.norm2(x), h, w))


class Stage(nn.Module):
    """Patch embedding (the stage's down-sampling), blocks, final LayerNorm."""

    def __init__(
        self,
        in_ch: int,
        dim: int,
        first: bool,
        heads: int,
        mlp_ratio: int,
        sr: int,
        drop_paths: Sequence[float],
    ) -> None:
        super().__init__()
        self.downsample = OverlapPatchEmbed(in_ch, dim, 7 if first else 3, 4 if first else 2)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, sr, p) for p in drop_paths)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        for block in self.blocks:
            tokens = block(tokens, h, w)
        return self.norm(tokens).transpose(1, 2).reshape(b, c, h, w)


class PVTv2(nn.Module):
    """The PVTv2 encoder: four stages at strides 4, 8, 16, 32 (b0: 32, 64, 160, 256 channels).

    ``drop_path`` is the stochastic-depth rate of the last block, rising linearly from 0
    (FedDP uses 0.1). ``forward`` returns the four stage outputs, finest first.

    Example:
        >>> sum(p.numel() for p in PVTv2(3).parameters())
        3409760
    """

    def __init__(
        self, in_channels: int = 3, settings: PVTv2Settings = B0, drop_path: float = 0.0
    ) -> None:
        super().__init__()
        total = sum(settings.depths)
        rates = [drop_path * i / max(total - 1, 1) for i in range(total)]
        chans = [in_channels, *settings.dims]
        self.stages = nn.ModuleList()
        start = 0
        for i, depth in enumerate(settings.depths):
            self.stages.append(
                Stage(
                    chans[i],
                    chans[i + 1],
                    i == 0,
                    settings.heads[i],
                    settings.mlp_ratios[i],
                    settings.sr_ratios[i],
                    rates[start : start + depth],
                )
            )
            start += depth
        self.channels: tuple[int, ...] = settings.dims
        self.apply(_init)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats


def _init(m: nn.Module) -> None:
    """The PVTv2 initialisation: truncated normal linears, fan-out normal convolutions."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


_ORIGINAL = (
    (re.compile(r"^patch_embed(\d+)\."), "stages.{}.downsample."),
    (re.compile(r"^block(\d+)\."), "stages.{}.blocks."),
    (re.compile(r"^norm(\d+)\."), "stages.{}.norm."),
)
_SKIP = ("head.",)


def convert_pvtv2_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A PVTv2 checkpoint's tensors under :class:`PVTv2`'s names.

    Accepts timm names (``stages.0.downsample.proj.weight``; a ``model.``/``module.`` or
    ``encoder.`` prefix is removed) and the original repository's names
    (``patch_embed1.proj.weight``, ``block1.0.mlp.dwconv.dwconv.weight``, ``norm1.weight``).
    The ImageNet classifier (``head.*``) is dropped. Raises ValueError naming keys it does not
    recognise.
    """
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in state.items():
        k = re.sub(r"^(module\.|model\.|encoder\.)+", "", key)
        if k.startswith(_SKIP):
            continue
        for pattern, repl in _ORIGINAL:
            match = pattern.match(k)
            if match:
                k = repl.format(int(match.group(1)) - 1) + k[match.end() :]
                break
        k = k.replace("dwconv.dwconv.", "dwconv.")
        if not k.startswith("stages."):
            unknown.append(key)
            continue
        out[k] = value
    if unknown:
        raise ValueError(f"not PVTv2 encoder keys: {unknown[:5]}")
    return out
