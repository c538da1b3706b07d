"""The FedLPPA network: UNet encoder, TDF at the bottleneck, main decoder with an MLP block,
and an auxiliary decoder (paper Sec. III-A/B, Fig. 2).

With 1 input channel, 2 classes, 256 px and 5 sites it has 2,897,430 trainable parameters
(paper Table IX: 2.8978M), of which the auxiliary decoder holds 641,202.

Parameter groups (state-dict prefixes): ``encoder.``, ``tdf.`` (prompts, fusion, attention),
``decoder.`` and ``mlp.`` (the main decoder phi), ``aux_decoder.`` (phi-bar).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from fedseg.models.layers import Norm, batch_norm, conv
from fedseg.models.tdf import TDF, Fusion
from fedseg.models.unet import CHANNELS, DROPOUT, Decoder, Encoder

__all__ = ["DualLogits", "FedLPPANet", "MLPBlock", "bottleneck_shape"]


def bottleneck_shape(image_size: Sequence[int], levels: int = len(CHANNELS)) -> tuple[int, ...]:
    """Spatial size of the deepest encoder feature for inputs of ``image_size``."""
    out = []
    for s in image_size:
        for _ in range(levels - 1):
            s //= 2
        out.append(s)
    if min(out, default=0) < 1:
        raise ValueError(f"image size {tuple(image_size)} is too small for {levels} levels")
    return tuple(out)


class DualLogits(NamedTuple):
    """Training-mode output of a network with an auxiliary decoder."""

    main: torch.Tensor
    aux: torch.Tensor


class MLPBlock(nn.Module):
    """Per-pixel MLP 320->128->64->16 (BN + LeakyReLU between), then global average pooling.

    Its output ``[B, 16, 1, 1]`` multiplies the main decoder's last feature (Hadamard
    product) before the segmentation head.
    """

    def __init__(self, ndim: int, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            conv(ndim, in_channels, 128, kernel_size=1),
            batch_norm(ndim, 128),
            nn.LeakyReLU(),
            conv(ndim, 128, 64, kernel_size=1),
            batch_norm(ndim, 64),
            nn.LeakyReLU(),
            conv(ndim, 64, out_channels, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        return y.mean(dim=tuple(range(2, y.ndim)), keepdim=True)


class FedLPPANet(nn.Module):
    """UNet + TDF + MLP-modulated main decoder + auxiliary decoder.

    ``forward(x)`` returns the main decoder's logits, except in training mode with an
    auxiliary decoder, where it returns :class:`DualLogits`. Call :meth:`set_site` before
    running a site's data (it selects the DDP slot and the ASP).

    Args:
        in_channels, num_classes, ndim: the task.
        image_size: input size (sets the prompt size, the bottleneck size).
        num_sites: number of DDP slots.
        tdf: use the TDF module and the MLP block (``False``: plain UNet bottleneck).
        aux_decoder: build the auxiliary decoder.
        ukp, asp, fusion, tdf_dropout: see :class:`~fedseg.models.tdf.TDF`.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        *,
        image_size: Sequence[int],
        num_sites: int,
        ndim: int = 2,
        tdf: bool = True,
        aux_decoder: bool = True,
        ukp: bool = True,
        asp: bool = True,
        fusion: Fusion = "dual",
        tdf_dropout: float = 0.5,
        tdf_channels: int = 64,
        channels: Sequence[int] = CHANNELS,
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
    ) -> None:
        super().__init__()
        if len(image_size) != ndim:
            raise ValueError(f"image_size needs {ndim} sizes, got {tuple(image_size)}")
        self.ndim = ndim
        self.encoder = Encoder(in_channels, ndim, channels, dropout_p, norm_kind)
        bottom = channels[-1]
        self.tdf: TDF | None = None
        self.mlp: MLPBlock | None = None
        if tdf:
            self.tdf = TDF(
                ndim,
                bottom,
                bottleneck_shape(image_size, len(channels)),
                num_sites,
                ukp=ukp,
                asp=asp,
                fusion=fusion,
                out_channels=tdf_channels,
                dropout_p=tdf_dropout,
            )
            bottom += tdf_channels
            self.mlp = MLPBlock(ndim, bottom, channels[0])
        self.decoder = Decoder(num_classes, ndim, channels, bottom, norm_kind, head_kernel)
        self.aux_decoder = (
            Decoder(num_classes, ndim, channels, bottom, norm_kind, head_kernel)
            if aux_decoder
            else None
        )

    def set_site(self, index: int, sparsity: str | None) -> None:
        """Prompts of site ``index`` (its DDP slot) with annotation ``sparsity`` (its ASP)."""
        if self.tdf is not None:
            self.tdf.set_site(index, sparsity)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Encoder features with the bottleneck replaced by ``cat(F, F~)`` (Eq. 6)."""
        feats = self.encoder(x)
        if self.tdf is not None:
            feats[-1] = torch.cat([feats[-1], self.tdf(feats[-1])], dim=1)
        return feats

    def main_logits(self, feats: list[torch.Tensor]) -> torch.Tensor:
        last = self.decoder.features(feats)[-1]
        if self.mlp is not None:
            last = last * self.mlp(feats[-1])
        return self.decoder.head(last)

    def forward_dual(self, x: torch.Tensor) -> DualLogits:
        """Logits of both decoders (needs the auxiliary decoder)."""
        if self.aux_decoder is None:
            raise RuntimeError("this FedLPPANet was built without an auxiliary decoder")
        feats = self.features(x)
        return DualLogits(self.main_logits(feats), self.aux_decoder(feats))

    def forward(self, x: torch.Tensor) -> torch.Tensor | DualLogits:  # type: ignore[override]
        if self.training and self.aux_decoder is not None:
            return self.forward_dual(x)
        return self.main_logits(self.features(x))
