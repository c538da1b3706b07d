"""Segmentation networks and their add-on modules; ``model:`` blocks name registered ones."""

from fedseg.models.registry import ModelConfig, get_model, list_models, parse_model
from fedseg.models.unet import UNet, UNetConfig, UNetOutput

__all__ = [
    "ModelConfig",
    "UNet",
    "UNetConfig",
    "UNetOutput",
    "get_model",
    "list_models",
    "parse_model",
]
