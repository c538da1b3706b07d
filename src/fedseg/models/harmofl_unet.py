"""The UNet of HarmoFL (Jiang et al., AAAI 2022) that FedBCS and its baselines train.

A preset of :class:`~fedseg.models.unet.UNet`: widths 32/64/128/256 with a 512-channel
bottleneck, bias-free 3x3 convolutions, BatchNorm without affine parameters or running
statistics (batch statistics in training and evaluation), ReLU, no dropout, 2x2 transposed
convolutions for upsampling and a 1x1 output convolution. With 3 input channels and 2 classes
the 2D network has 7,757,186 trainable parameters (no AmpNorm layer: HarmoFL's method adds it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import PositiveInt, field_validator
from torch import nn

from fedseg.models.registry import ModelConfig, register_model
from fedseg.models.unet import UNet

__all__ = ["HARMOFL_WIDTHS", "HarmoFLUNetConfig"]

HARMOFL_WIDTHS = (32, 64, 128, 256, 512)


@register_model("harmofl_unet")
class HarmoFLUNetConfig(ModelConfig):
    """HarmoFL's UNet (``widths``: channels per level, the last one the bottleneck)."""

    name: Literal["harmofl_unet"] = "harmofl_unet"
    widths: tuple[PositiveInt, ...] = HARMOFL_WIDTHS

    @field_validator("widths")
    @classmethod
    def _depth(cls, widths: tuple[int, ...]) -> tuple[int, ...]:
        if len(widths) < 2:
            raise ValueError(f"needs at least 2 levels, got {list(widths)}")
        return widths

    def build(self, in_channels: int, num_classes: int, ndim: int) -> nn.Module:
        return UNet(
            in_channels,
            num_classes,
            ndim,
            channels=self.widths,
            dropout_p=(0.0,) * len(self.widths),
            norm_kind="batch_stats",
            head_kernel=1,
            act="relu",
            conv_bias=False,
            upsample="transpose",
        )
