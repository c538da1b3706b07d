"""Frequency-domain Style Recalibration (FSR) of FedBCS (Zhao et al., AAAI 2026, Sec. 3.2).

A feature map is split by the Fourier transform into amplitude (style) and phase (content)
(Eqs. 4-5); the amplitude is replaced by a learned mix of the amplitude of the
instance-normalised map and the original amplitude (Eq. 6) and the map is re-synthesised
with the original phase (Eq. 7), followed by a per-channel affine (gamma = 1, beta = 0 at
start) as in the authors' code. Works on 2D and 3D maps ``[B, C, *S]``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FSR", "FSRGate", "spectrum_mean"]

FSRGate = Literal["learned", "gap"]
"""``learned``: one learnable pair (h_norm, h_org) per module, weights softmax(h / T) (the
authors' code; both 0.5 at start); ``gap``: per-sample weights sigmoid(W_s [GAP(amp_norm);
GAP(amp)]) from the globally pooled amplitudes (the paper's Eq. 6), the amplitudes scaled by
1/HW as in Eq. 4."""


def spectrum_mean(amp: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """GAP over the whole spectrum of Eq. 4's amplitude ``|Z| = |FFT(z)| / HW``, from the
    unnormalised ``rfftn`` amplitude ``amp`` ``[B, C, *S']`` of maps of spatial ``size``:
    ``[B, C]``. The half spectrum stands for its mirror image (weight 2) except the
    self-conjugate first and (for an even size) last columns."""
    n = math.prod(size)
    weight = torch.full((amp.shape[-1],), 2.0, dtype=amp.dtype, device=amp.device)
    weight[0] = 1.0
    if size[-1] % 2 == 0:
        weight[-1] = 1.0
    total = (amp * weight).sum(dim=tuple(range(2, amp.dim())))
    return total / (n * n)


class FSR(nn.Module):
    """Recalibrate the style (Fourier amplitude) of ``channels``-channel feature maps while
    keeping their content (Fourier phase).

    With weights (norm, org) = (0, 1) the module is the identity (before the affine); with
    (1, 0) every channel of every map gets zero mean and unit variance, whatever its affine
    "style" (the amplitude of the instance-normalised map), and keeps its phase.
    """

    def __init__(
        self,
        channels: int,
        gate: FSRGate = "learned",
        temperature: float = 0.1,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"FSR temperature must be > 0, got {temperature}")
        self.gate, self.temperature, self.eps = gate, temperature, eps
        if gate == "learned":
            self.logits = nn.Parameter(torch.zeros(2))
        elif gate == "gap":
            self.gate_fc = nn.Linear(2 * channels, 2)
        else:
            raise ValueError(f"FSR gate must be 'learned' or 'gap', got {gate!r}")
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def gate_input(
        self, amp_norm: torch.Tensor, amp: torch.Tensor, size: tuple[int, ...]
    ) -> torch.Tensor:
        """``[B, 2C]``: ``[GAP(chi_norm); GAP(chi)]`` of Eq. 6 (Eq. 4's 1/HW scaling)."""
        return torch.cat([spectrum_mean(amp_norm, size), spectrum_mean(amp, size)], dim=1)

    def style_weights(
        self, amp_norm: torch.Tensor, amp: torch.Tensor, size: tuple[int, ...]
    ) -> torch.Tensor:
        """``[B or 1, 2]`` weights (lambda_norm, lambda_org) of the two amplitudes of maps of
        spatial ``size``."""
        if self.gate == "learned":
            return torch.softmax(self.logits / self.temperature, 0)[None]
        return torch.sigmoid(self.gate_fc(self.gate_input(amp_norm, amp, size)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's FFTs take no bfloat16 (cuFFT and pocketFFT) and half only at powers of two:
        # the recalibration runs in float32 under any autocast
        with torch.autocast(x.device.type, enabled=False):
            return self._recalibrate(x.to(torch.promote_types(x.dtype, torch.float32)))

    def _recalibrate(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(2, x.dim()))
        spec = torch.fft.rfftn(x, dim=dims)
        amp = spec.abs()
        amp_norm = torch.fft.rfftn(F.instance_norm(x, eps=self.eps), dim=dims).abs()
        phase = spec / amp.clamp_min(self.eps)  # e^{i gamma}: the content of x
        w = self.style_weights(amp_norm, amp, tuple(x.shape[2:]))
        w = w.view(-1, 2, *([1] * (x.dim() - 1)))
        mixed = w[:, 0] * amp_norm + w[:, 1] * amp
        out = torch.fft.irfftn(mixed * phase, s=x.shape[2:], dim=dims)
        shape = (1, -1, *([1] * len(dims)))
        return out * self.gamma.view(shape) + self.beta.view(shape)
