"""The LC-Fed network (Wang, Jin, Wang, ECCV 2022) on fedseg's UNet.

* :class:`ChannelSelection` (PCS, feature-level calibration): a one-hot site embedding is
  encoded to a channel code; average- and max-pooled features, each concatenated with the
  code, pass one shared bottleneck MLP; ``hmap = sigmoid(a + b)`` re-weights the channels
  residually, ``x + x * hmap``. It sits after the deepest encoder block (LC-Fed's default
  ``pcs_n = 1``). Unlike the authors' code it is a registered, trained submodule.
* :class:`HeadCalibration` (HC, prediction-level calibration): the disagreement between the
  site's own head and every other site's head on the last decoder feature gives a sparse
  peak map (non-maximum suppression); Gaussian-blurred peaks and the blurred own prediction
  modulate the feature (``f * s + f``, per class), and a 3x3 convolution predicts the
  calibrated logits.

With 1 input channel, 2 classes and 5 sites :class:`FedLCNet` has 1,893,732 trainable
parameters: UNet 1,813,474 + PCS 79,104 + HC 1,154 (see ``docs/methods/fedlc.md`` for the
paper's 2.1109M).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedseg.models.layers import Norm, conv
from fedseg.models.unet import CHANNELS, DROPOUT, Decoder, Encoder

__all__ = [
    "ChannelSelection",
    "FedLCNet",
    "HeadCalibration",
    "LCOutput",
    "PromptedUNet",
    "disagreement_peaks",
    "gaussian_kernel",
]

HeadWeights = tuple[torch.Tensor, torch.Tensor]
"""A segmentation head given by its (weight, bias)."""


class ChannelSelection(nn.Module):
    """Personalized channel selection driven by a one-hot site embedding.

    Parameters
    ----------
    channels
        Channels of the feature it re-weights (256 at the UNet bottleneck).
    num_sites
        Length of the one-hot site embedding.
    reduction
        Bottleneck ratio of the shared MLP (16, as LC-Fed).
    ndim
        2 or 3 spatial dimensions.
    """

    def __init__(self, channels: int, num_sites: int, reduction: int = 16, ndim: int = 2) -> None:
        super().__init__()
        if num_sites < 1:
            raise ValueError(f"ChannelSelection: num_sites must be >= 1, got {num_sites}")
        hidden = max(channels // reduction, 1)
        self.num_sites, self.ndim = num_sites, ndim
        self.embed = nn.Sequential(
            conv(ndim, num_sites, channels, kernel_size=1, bias=False),
            nn.ReLU(),
            conv(ndim, channels, channels, kernel_size=1, bias=False),
        )
        self.mlp = nn.Sequential(
            conv(ndim, 2 * channels, hidden, kernel_size=1, bias=False),
            nn.ReLU(),
            conv(ndim, hidden, channels, kernel_size=1, bias=False),
        )

    def site_code(self, site: int, like: torch.Tensor) -> torch.Tensor:
        """The channel code ``[1, C, 1, ...]`` of site ``site`` (a one-hot embedding)."""
        if not 0 <= site < self.num_sites:
            raise ValueError(f"ChannelSelection: site must be in [0, {self.num_sites}), got {site}")
        onehot = like.new_zeros((1, self.num_sites) + (1,) * self.ndim)
        onehot[0, site] = 1.0
        return self.embed(onehot)

    def attention(self, x: torch.Tensor, site: int) -> torch.Tensor:
        """Channel attention ``hmap`` ``[B, C, 1, ...]`` of ``x`` for site ``site``."""
        dims = tuple(range(2, x.ndim))
        code = self.site_code(site, x).expand(x.shape[0], *[-1] * (x.ndim - 1))
        avg = self.mlp(torch.cat([x.mean(dims, keepdim=True), code], 1))
        top = self.mlp(torch.cat([x.amax(dims, keepdim=True), code], 1))
        return torch.sigmoid(avg + top)

    def forward(self, x: torch.Tensor, site: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + x * hmap, hmap)``."""
        hmap = self.attention(x, site)
        return x + x * hmap, hmap


def gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    """A ``[1, 1, size, size]`` Gaussian scaled to a peak of 1 (LC-Fed's soft map)."""
    r = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * sigma**2))
    return (g / g.max()).view(1, 1, size, size)


def disagreement_peaks(
    probs: torch.Tensor, site: int, kernel: int = 31, threshold: float = 0.2
) -> torch.Tensor:
    """Sparse peaks ``[B, C, H, W]`` of the heads' disagreement with head ``site``.

    ``probs`` ``[K, B, C, H, W]`` are the class probabilities of all K sites' heads.
    ``u = sqrt(sum_j (p_j - p_site)^2 / (K - 1))``, divided by its per-image, per-class
    maximum; a pixel is a peak where it equals the ``kernel``-window maximum and exceeds
    ``threshold``. One head gives no peaks.
    """
    k = probs.shape[0]
    if k < 2:
        return torch.zeros_like(probs[0])
    u = ((probs - probs[site]).pow(2).sum(0) / (k - 1)).sqrt()
    u = u / u.amax((-2, -1), keepdim=True).clamp(min=1e-12)
    local_max = F.max_pool2d(u, kernel, stride=1, padding=kernel // 2)
    return ((u == local_max) & (u > threshold)).to(u.dtype)


class HeadCalibration(nn.Module):
    """LC-Fed's head calibration: peaks and prediction blurred, modulating the feature.

    Parameters
    ----------
    num_classes, features
        Classes C and channels F of the last decoder feature; the 3x3 convolution maps
        ``2 * C * F`` channels to C.
    kernel, sigma, threshold
        Window of the non-maximum suppression and of the Gaussian (31), the Gaussian's sigma
        (6) and the peak threshold (0.2).
    """

    def __init__(
        self,
        num_classes: int,
        features: int,
        kernel: int = 31,
        sigma: float = 6.0,
        threshold: float = 0.2,
    ) -> None:
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"HeadCalibration: kernel must be odd and >= 1, got {kernel}")
        self.kernel, self.threshold = kernel, threshold
        self.head = nn.Conv2d(2 * num_classes * features, num_classes, 3, padding=1)
        self.register_buffer("gauss", gaussian_kernel(kernel, sigma), persistent=False)

    def _blur(self, maps: torch.Tensor) -> torch.Tensor:
        b, c, h, w = maps.shape
        out = F.conv2d(maps.reshape(b * c, 1, h, w), self.gauss, padding=self.kernel // 2)
        return out.reshape(b, c, h, w)

    def forward(
        self, feature: torch.Tensor, heads: torch.Tensor, own: torch.Tensor, site: int
    ) -> torch.Tensor:
        """Calibrated logits from ``feature`` ``[B, F, H, W]``, the probabilities of every
        site's head ``heads`` ``[K, B, C, H, W]`` (row ``site``: the site's own head) and the
        site's current prediction ``own`` ``[B, C, H, W]``."""
        peaks = disagreement_peaks(heads, site, self.kernel, self.threshold)
        s1, s2 = self._blur(peaks), self._blur(own)
        parts = []
        for c in range(s1.shape[1]):
            parts += [feature * s1[:, c : c + 1] + feature, feature * s2[:, c : c + 1] + feature]
        return self.head(torch.cat(parts, 1))


class PromptedUNet(nn.Module):
    """UNet encoder, channel selection on the deepest feature, UNet decoder (2D).

    ``site`` is a plain attribute (not a weight): the site whose one-hot embedding
    ``forward`` uses. Subclasses add heads.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        num_sites: int,
        channels: Sequence[int],
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
    ) -> None:
        super().__init__()
        self.encoder = Encoder(in_channels, 2, channels, dropout_p, norm_kind)
        self.pcs = ChannelSelection(channels[-1], num_sites)
        self.decoder = Decoder(num_classes, 2, channels, None, norm_kind, head_kernel)
        self.site = 0

    def encode(
        self, x: torch.Tensor, site: int
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Encoder features with the channel selection for ``site`` applied to the deepest
        one, its attention map, and the deepest feature before the selection."""
        feats = self.encoder(x)
        bottleneck = feats[-1]
        feats[-1], hmap = self.pcs(bottleneck, site)
        return feats, hmap, bottleneck


@dataclass
class LCOutput:
    """Everything one forward pass of :class:`FedLCNet` yields for training."""

    logits: torch.Tensor
    feature: torch.Tensor
    """Last decoder feature (input of the head)."""
    hmap: torch.Tensor
    """Channel attention of the PCS."""
    bottleneck: torch.Tensor
    """Deepest encoder feature before the PCS."""


class FedLCNet(PromptedUNet):
    """UNet + PCS at the bottleneck + head calibration (2D).

    ``forward(x)`` returns the logits a site is evaluated with: the main head's, or with
    ``calibrate`` set the HC output, which needs ``peer_heads`` (every site's head, in site
    order). ``site`` selects the one-hot embedding. These three are plain attributes set by
    the method, not weights.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        num_sites: int,
        *,
        channels: Sequence[int] = CHANNELS,
        hc_kernel: int = 31,
        hc_sigma: float = 6.0,
        hc_threshold: float = 0.2,
        dropout_p: Sequence[float] = DROPOUT,
        norm_kind: Norm = "batch",
        head_kernel: int = 3,
    ) -> None:
        super().__init__(
            in_channels, num_classes, num_sites, channels, dropout_p, norm_kind, head_kernel
        )
        self.hc = HeadCalibration(num_classes, channels[0], hc_kernel, hc_sigma, hc_threshold)
        self.calibrate = False
        self.peer_heads: list[HeadWeights] | None = None

    def run(self, x: torch.Tensor, site: int) -> LCOutput:
        """Encoder, PCS for ``site``, decoder and main head."""
        feats, hmap, bottleneck = self.encode(x, site)
        feature = self.decoder.features(feats)[-1]
        return LCOutput(self.decoder.head(feature), feature, hmap, bottleneck)

    def calibrated(self, out: LCOutput, site: int, peers: Sequence[HeadWeights]) -> torch.Tensor:
        """HC logits from ``out`` and every site's head ``peers`` (in site order, as sent at
        the start of the round). Feature and probabilities are detached: only HC learns."""
        if len(peers) != self.pcs.num_sites:
            raise ValueError(f"FedLCNet: need {self.pcs.num_sites} peer heads, got {len(peers)}")
        feature = out.feature.detach()
        with torch.no_grad():
            heads = torch.stack(
                [
                    torch.softmax(F.conv2d(feature, w, b, padding=w.shape[-1] // 2), 1)
                    for w, b in peers
                ]
            )
            own = torch.softmax(out.logits.detach(), 1)
        return self.hc(feature, heads, own, site)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.run(x, self.site)
        if not self.calibrate:
            return out.logits
        if self.peer_heads is None:
            raise ValueError("FedLCNet: calibrate is set but peer_heads are missing")
        return self.calibrated(out, self.site, self.peer_heads)
