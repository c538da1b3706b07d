"""The FedICRA network (Lin et al., MLMI 2023): LC-Fed's channel selection on the encoder,
driven by the site's one-hot prompt, and a multi-head decoder.

The decoder is fedseg's UNet decoder; three deep-supervision heads read the outputs of
``up2`` (64 channels, 1/4 resolution), ``up3`` (32, 1/2) and ``up4`` (16, full). Each head is
conv3x3 -> ``hidden`` (512) - BN - ReLU - Dropout2d(0.1) - conv1x1 -> C without bias. The
heads get no label loss: they shape the high-level trees of the tree-energy loss.

With 1 input channel, 2 classes and 5 sites it has 2,416,354 trainable parameters: UNet
1,813,474 + heads 523,776 + channel selection 79,104. The paper's 2.3372M (Table IX) is the
same network without the channel selection, whose weights the authors' code never registered
(2,337,250).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedseg.models.fedlc_net import PromptedUNet
from fedseg.models.layers import Norm
from fedseg.models.unet import CHANNELS, DROPOUT

__all__ = ["AuxHead", "FedICRANet", "ICRAOutput"]


class AuxHead(nn.Sequential):
    """conv3x3 (bias) - BN - ReLU - Dropout2d(0.1) - conv1x1 (no bias)."""

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 512) -> None:
        super().__init__(
            nn.Conv2d(in_channels, hidden, 3, padding=1),
            nn.BatchNorm2d(hidden),
            nn.ReLU(),
            nn.Dropout2d(0.1),
            nn.Conv2d(hidden, num_classes, 1, bias=False),
        )


@dataclass
class ICRAOutput:
    """Training-mode output of :class:`FedICRANet`."""

    logits: torch.Tensor
    aux: list[torch.Tensor]
    """Logits of the deep-supervision heads, coarsest first (1/4, 1/2, full resolution)."""
    hmap: torch.Tensor
    bottleneck: torch.Tensor
    """Deepest encoder feature before the channel selection."""


class FedICRANet(PromptedUNet):
    """Encoder + channel selection (site prompt) + decoder + three auxiliary heads (2D).

    ``forward(x)`` returns the main logits for the site in the plain attribute ``site``.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        num_sites: int,
        *,
        channels: Sequence[int] = CHANNELS,
        aux_hidden: int = 512,
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
    ) -> None:
        super().__init__(
            in_channels, num_classes, num_sites, channels, dropout_p, norm_kind, head_kernel
        )
        self.aux_heads = nn.ModuleList(
            AuxHead(c, num_classes, aux_hidden) for c in (channels[2], channels[1], channels[0])
        )

    def run(self, x: torch.Tensor, site: int, aux: bool = True) -> ICRAOutput:
        """Every output of one pass for ``site`` (auxiliary heads only with ``aux``)."""
        feats, hmap, bottleneck = self.encode(x, site)
        dec = self.decoder.features(feats)
        heads = [h(f) for h, f in zip(self.aux_heads, dec[1:], strict=True)] if aux else []
        return ICRAOutput(self.decoder.head(dec[-1]), heads, hmap, bottleneck)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.site, aux=False).logits
