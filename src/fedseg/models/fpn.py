"""Feature Pyramid Network decoder (Lin et al., CVPR 2017) in the semantic-segmentation form
of segmentation-models-pytorch's ``FPNDecoder``, and the ``pvtv2_fpn`` network of FedDP and
the virtual-class paper ("Ours†"): PVTv2-b0 encoder + FPN + 1x1 head.

For the b0 encoder channels (32, 64, 160, 256) with 256 pyramid and 128 segmentation
channels the decoder has 1,755,904 parameters (smp ``FPNDecoder``); the whole network has
5,165,793 with one output channel and 5,165,922 with two (3 input channels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveInt
from torch import nn

from fedseg.errors import ConfigError
from fedseg.models.layers import resize_nearest
from fedseg.models.paa import PAA
from fedseg.models.pvtv2 import PVTv2, convert_pvtv2_state_dict
from fedseg.models.registry import ModelConfig, register_model

__all__ = [
    "FPNBlock",
    "FPNDecoder",
    "PVTv2FPN",
    "PVTv2FPNConfig",
    "SegOutput",
    "load_pvtv2_weights",
]

DecoderInit = Literal["kaiming", "torch"]
"""How :class:`FPNDecoder` initialises its convolutions."""
Upsample = Literal["logits", "probabilities"]
"""What the x4 up-sampling to the input size interpolates: the head's logits, or its class
probabilities (FedDP's code: a sigmoid, then ``F.interpolate``), returned as their logarithm
so that a softmax of the output gives the interpolated probabilities."""


class FPNBlock(nn.Module):
    """Top-down step: nearest up-sampling of the coarser pyramid level plus a 1x1 lateral
    projection of the encoder feature."""

    def __init__(self, pyramid_ch: int, skip_ch: int) -> None:
        super().__init__()
        self.skip_conv = nn.Conv2d(skip_ch, pyramid_ch, 1)

    def upsample(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """``x`` resized (nearest) to ``skip``'s grid (x2 for sizes divisible by 32)."""
        return resize_nearest(x, skip.shape[2:])

    def forward(
        self, x: torch.Tensor, skip: torch.Tensor, paa: nn.Module | None = None
    ) -> torch.Tensor:
        """The finer level; ``paa(d, skip)`` (the virtual-class paper's affinity
        aggregation) is added to the up-sampled ``d`` when given."""
        d = self.upsample(x, skip)
        if paa is not None:
            d = d + paa(d, skip)
        return d + self.skip_conv(skip)


class Conv3x3GNReLU(nn.Sequential):
    """conv3x3 (no bias) - GroupNorm(32) - ReLU, then optional bilinear x2."""

    def __init__(self, in_ch: int, out_ch: int, upsample: bool) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
            nn.GroupNorm(32, out_ch),
            nn.ReLU(inplace=True),
        )
        self.up = upsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = super().forward(x)
        if self.up:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        return x


def _segmentation_block(in_ch: int, out_ch: int, n_upsamples: int) -> nn.Sequential:
    """``max(1, n)`` Conv3x3GNReLU blocks taking a pyramid level ``n`` octaves up."""
    blocks = [Conv3x3GNReLU(in_ch, out_ch, n_upsamples > 0)]
    blocks += [Conv3x3GNReLU(out_ch, out_ch, True) for _ in range(1, n_upsamples)]
    return nn.Sequential(*blocks)


class FPNDecoder(nn.Module):
    """Pyramid p5..p2 from the four encoder features, one segmentation branch per level
    brought to the finest level (stride 4), summed, spatial dropout.

    :meth:`pyramid` returns the levels (coarsest first); ``forward`` the merged map with
    ``segmentation_channels`` channels at the resolution of the finest encoder feature.
    ``init``: ``kaiming`` (He-uniform convolution weights for ReLU, zero biases: what
    segmentation-models-pytorch's ``FPN`` model applies) or ``torch`` (PyTorch's default
    layer initialisation: FedDP's code, which builds that library's ``FPNDecoder`` bare).
    """

    def __init__(
        self,
        encoder_channels: Sequence[int],
        pyramid_channels: int = 256,
        segmentation_channels: int = 128,
        dropout: float = 0.2,
        init: DecoderInit = "kaiming",
    ) -> None:
        super().__init__()
        if len(encoder_channels) != 4:
            raise ValueError(f"FPNDecoder needs 4 encoder levels, got {list(encoder_channels)}")
        c2, c3, c4, c5 = encoder_channels
        self.p5 = nn.Conv2d(c5, pyramid_channels, 1)
        self.p4 = FPNBlock(pyramid_channels, c4)
        self.p3 = FPNBlock(pyramid_channels, c3)
        self.p2 = FPNBlock(pyramid_channels, c2)
        self.seg_blocks = nn.ModuleList(
            _segmentation_block(pyramid_channels, segmentation_channels, n) for n in (3, 2, 1, 0)
        )
        self.dropout = nn.Dropout2d(dropout)
        self.out_channels = segmentation_channels
        if init == "torch":
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def pyramid(
        self, feats: Sequence[torch.Tensor], paa: Sequence[nn.Module] = ()
    ) -> list[torch.Tensor]:
        """``[p5, p4, p3, p2]`` from the encoder features ``[c2, c3, c4, c5]``; ``paa``: one
        affinity-aggregation module per top-down step (p4, p3, p2) or none."""
        fuse = list(paa) or [None, None, None]
        levels = [self.p5(feats[3])]
        for block, skip, m in zip((self.p4, self.p3, self.p2), feats[2::-1], fuse, strict=True):
            levels.append(block(levels[-1], skip, m))
        return levels

    def merge(self, levels: Sequence[torch.Tensor]) -> torch.Tensor:
        """Sum of the segmentation branches (each at the finest level's size), dropout."""
        size = levels[-1].shape[2:]
        out = None
        for block, p in zip(self.seg_blocks, levels, strict=True):
            y = block(p)
            if y.shape[2:] != size:
                y = F.interpolate(y, size=size, mode="bilinear", align_corners=True)
            out = y if out is None else out + y
        assert out is not None
        return self.dropout(out)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.merge(self.pyramid(feats))


@dataclass
class SegOutput:
    """Logits plus named intermediate features (see :func:`fedseg.models.features`)."""

    logits: torch.Tensor
    features: dict[str, torch.Tensor]


class FPNHead(nn.Module):
    """The FPN decoder (``fpn``) and the 1x1 output convolution (``head``): the head's
    state-dict keys start with ``decoder.head.`` as the UNet's, so head/body methods
    (FedRep, FedBABU) find it under the same name."""

    def __init__(self, encoder_channels: Sequence[int], num_classes: int, **fpn: Any) -> None:
        super().__init__()
        self.fpn = FPNDecoder(encoder_channels, **fpn)
        self.head: nn.Module = nn.Conv2d(self.fpn.out_channels, num_classes, 1)


class PVTv2FPN(nn.Module):
    """PVTv2-b0 encoder + FPN decoder + 1x1 head; logits bilinearly up-sampled (x4) to the
    input size.

    Features (:meth:`forward_features`): ``enc1`` ... ``enc4`` (strides 4 ... 32, 32/64/160/256
    channels), ``dec4`` ... ``dec1`` (pyramid levels p5 ... p2 at the strides of ``enc4`` ...
    ``enc1``, ``pyramid_channels`` each) and ``fpn`` (the merged map the head reads, stride 4).
    ``paa`` adds the virtual-class paper's affinity aggregation to the top-down steps
    (``paa.{0,1,2}`` for p4, p3, p2; see :mod:`fedseg.models.paa`).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        drop_path: float = 0.1,
        pyramid_channels: int = 256,
        segmentation_channels: int = 128,
        dropout: float = 0.2,
        paa: bool = False,
        decoder_init: DecoderInit = "torch",
        upsample: Upsample = "probabilities",
    ) -> None:
        super().__init__()
        if upsample == "probabilities" and num_classes < 2:
            raise ValueError("upsample: probabilities takes a softmax over >= 2 classes")
        self.upsample = upsample
        self.encoder = PVTv2(in_channels, drop_path=drop_path)
        self.decoder = FPNHead(
            self.encoder.channels,
            num_classes,
            pyramid_channels=pyramid_channels,
            segmentation_channels=segmentation_channels,
            dropout=dropout,
            init=decoder_init,
        )
        fpn = self.decoder.fpn
        self.paa = (
            nn.ModuleList(
                PAA(pyramid_channels, b.skip_conv.in_channels) for b in (fpn.p4, fpn.p3, fpn.p2)
            )
            if paa
            else nn.ModuleList()
        )

    def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The encoder features ``enc1`` ... ``enc4``; the hook :class:`~fedseg.models.unet.UNet`
        offers too (a subclass may transform them before the decoder)."""
        return self.encoder(x)

    def forward_features(self, x: torch.Tensor) -> SegOutput:
        """Run the network and keep every encoder, pyramid and merged feature."""
        enc = self.encode(x)
        levels = self.decoder.fpn.pyramid(enc, self.paa)
        merged = self.decoder.fpn.merge(levels)
        head = self.decoder.head(merged)
        probabilities = self.upsample == "probabilities"
        up = F.interpolate(
            head.softmax(1) if probabilities else head,
            size=x.shape[2:],
            mode="bilinear",
            align_corners=False,
        )
        logits = up.clamp_min(torch.finfo(up.dtype).tiny).log() if probabilities else up
        feats = {f"enc{i + 1}": f for i, f in enumerate(enc)}
        feats |= {f"dec{4 - i}": p for i, p in enumerate(levels)}
        feats["fpn"] = merged
        return SegOutput(logits, feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x).logits


def load_pvtv2_weights(model: PVTv2FPN, path: str | Path) -> None:
    """Load a PVTv2-b0 checkpoint (timm or original key names; the classifier is dropped)
    into ``model.encoder``; ValueError when keys or shapes do not fit. Tested with synthetic
    state dicts under those names only, not with a real ImageNet checkpoint."""
    raw = torch.load(Path(path), map_location="cpu", weights_only=True)
    if isinstance(raw, dict) and isinstance(raw.get("state_dict"), dict):
        raw = raw["state_dict"]
    state = convert_pvtv2_state_dict(raw)
    own = model.encoder.state_dict()
    missing = sorted(set(own) - set(state))
    bad = [k for k in own if k in state and state[k].shape != own[k].shape]
    if missing or bad:
        raise ValueError(
            f"{path}: not a PVTv2-b0 checkpoint for this encoder (missing {missing[:3]}, "
            f"shape mismatch {bad[:3]}; ImageNet weights need 3 input channels)"
        )
    extra = sorted(set(state) - set(own))
    if extra:
        raise ValueError(f"{path}: keys this encoder lacks: {extra[:3]}")
    model.encoder.load_state_dict(state)


@register_model("pvtv2_fpn")
class PVTv2FPNConfig(ModelConfig):
    """PVTv2-b0 + FPN (FedDP; the virtual-class paper's "Ours†"), 2D only.

    ``drop_path``: stochastic depth of the last encoder block (FedDP: 0.1);
    ``pyramid_channels``/``segmentation_channels``/``dropout``: the FPN (smp defaults);
    ``weights``: an ImageNet PVTv2-b0 checkpoint (timm or original key names) loaded into the
    encoder when the network is built (default none: random initialisation);
    ``decoder_init``: the FPN's initialisation (:class:`FPNDecoder`);
    ``upsample``: what the output's x4 up-sampling interpolates (:data:`Upsample`).
    Both default to FedDP's code (``torch``, ``probabilities``) since 2026-12-05; before,
    ``kaiming`` and ``logits`` (smp's ``FPN`` model), which a run's dump without them ran.
    """

    name: Literal["pvtv2_fpn"] = "pvtv2_fpn"
    drop_path: float = Field(0.1, ge=0, lt=1)
    pyramid_channels: PositiveInt = 256
    segmentation_channels: PositiveInt = Field(128, multiple_of=32)
    dropout: NonNegativeFloat = Field(0.2, lt=1)
    weights: Path | None = None
    decoder_init: DecoderInit = "torch"
    upsample: Upsample = "probabilities"

    def channels_last_faster(self, ndim: int) -> bool:
        """No: on CPU a channels-last training step is within 5% of a contiguous one and
        evaluation is slower (docs/benchmarks_speed.md)."""
        return False

    def bf16_auto(self, ndim: int) -> bool:
        """No: bf16 does not speed the PVTv2-FPN up at these sizes (162 -> 156 ms per step,
        docs/benchmarks_speed.md) and it was not compared with float32 over seeds."""
        return False

    def build(
        self, in_channels: int, num_classes: int, ndim: int, *, paa: bool = False
    ) -> PVTv2FPN:
        """The network; ``paa`` adds affinity-aggregation modules (virtual-class method)."""
        if ndim != 2:
            raise ConfigError(f"model.name: pvtv2_fpn is 2D only, the task has ndim={ndim}")
        net = PVTv2FPN(
            in_channels,
            num_classes,
            drop_path=self.drop_path,
            pyramid_channels=self.pyramid_channels,
            segmentation_channels=self.segmentation_channels,
            dropout=self.dropout,
            paa=paa,
            decoder_init=self.decoder_init,
            upsample=self.upsample,
        )
        if self.weights is not None:
            try:
                load_pvtv2_weights(net, self.weights)
            except (OSError, ValueError, RuntimeError) as e:
                raise ConfigError(f"model.weights: {e}") from None
        return net
