"""UNet with an auxiliary decoder: the dual-decoder WSS model of FedLPPA's Table VI.

The auxiliary decoder has the main decoder's architecture and reads the same encoder
features; it is initialised differently (Kaiming-normal convolutions instead of PyTorch's
default Kaiming-uniform), so the two decoders start from different views of the input.
With 1 input channel and 2 classes the 2D network has 1,813,474 + 633,010 = 2,446,484
trainable parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedseg.models.layers import Norm
from fedseg.models.unet import CHANNELS, DROPOUT, Decoder, UNet

__all__ = ["DualDecoderUNet", "DualOutputs", "kaiming_normal_init"]


def kaiming_normal_init(module: nn.Module) -> None:
    """Kaiming-normal conv weights with zero biases; BN weight 1 and bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="leaky_relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.BatchNorm3d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class DualDecoderUNet(UNet):
    """A :class:`UNet` plus ``aux_decoder``; ``forward`` returns the main decoder's logits.

    Example:
        >>> net = DualDecoderUNet(in_channels=1, num_classes=2)
        >>> sum(p.numel() for p in net.parameters())
        2446484
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
    ) -> None:
        super().__init__(
            in_channels, num_classes, ndim, channels, dropout_p, norm_kind, head_kernel
        )
        self.aux_decoder = Decoder(num_classes, ndim, channels, None, norm_kind, head_kernel)
        kaiming_normal_init(self.aux_decoder)

    def forward_dual(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(main logits, auxiliary logits)`` from one encoder pass."""
        feats = self.encoder(x)
        return self.decoder(feats), self.aux_decoder(feats)


class DualOutputs(nn.Module):
    """A view of a :class:`DualDecoderUNet` whose ``forward`` returns both decoders' logits.

    It owns no parameters of its own, so ``view.parameters()`` are the network's.
    """

    def __init__(self, net: DualDecoderUNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net.forward_dual(x)
