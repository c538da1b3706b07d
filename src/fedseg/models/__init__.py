"""Segmentation networks and their add-on modules."""

from fedseg.models.unet import UNet, UNetOutput

__all__ = ["UNet", "UNetOutput"]
