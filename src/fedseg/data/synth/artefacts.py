"""Per-site appearance changes: optical (gain, contrast, blur, vignetting, noise) with numpy,
and MR scanner artefacts (bias field, ghosting, Rician noise, Gibbs ringing, low resolution)
with MONAI/torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from scipy import ndimage

from fedseg.data.arrays import normalize_intensity

__all__ = ["ScannerProfile", "adjust", "blur", "gaussian_noise", "vignette"]

if TYPE_CHECKING:
    from monai.transforms import Randomizable

RandT = TypeVar("RandT", bound="Randomizable")


def adjust(
    image: np.ndarray, *, gain: float = 1.0, contrast: float = 1.0, gamma: float = 1.0
) -> np.ndarray:
    """``gain * (mean + contrast * (x - mean)) ** gamma`` clipped to [0, 1] (per image)."""
    mean = image.mean()
    out = np.clip(mean + contrast * (image - mean), 0, 1) ** gamma
    return np.clip(gain * out, 0, 1).astype(np.float32)


def blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of every channel of a (C, H, W) image (``sigma`` in pixels)."""
    if sigma <= 0:
        return image
    return ndimage.gaussian_filter(image, (0, sigma, sigma)).astype(np.float32)


def vignette(shape: tuple[int, int], strength: float, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative radial fall-off ``1 - strength * r^2`` around a jittered centre."""
    yy, xx = np.indices(shape, dtype=np.float64)
    cy, cx = (np.asarray(shape) - 1) / 2 + rng.normal(0, 0.05, 2) * np.asarray(shape)
    r2 = ((yy - cy) / shape[0]) ** 2 + ((xx - cx) / shape[1]) ** 2
    return np.clip(1 - strength * 2 * r2, 0, 1).astype(np.float32)


def gaussian_noise(image: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise, clipped to [0, 1]."""
    return np.clip(image + rng.normal(0, std, image.shape), 0, 1).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class ScannerProfile:
    """MR acquisition artefacts of one simulated site (lengths in pixels at 64 px, scaled)."""

    name: str
    gamma: tuple[float, float] = (1.0, 1.0)
    """Range of the contrast gamma."""
    bias: float = 0.0
    """Bias-field coefficient range upper bound (MONAI ``RandBiasField``, degree 3)."""
    ghosts: int = 0
    """Number of ghosts along the phase-encoding axis (k-space line modulation)."""
    ghost_intensity: float = 0.0
    blur: float = 0.0
    """Gaussian blur sigma."""
    low_res: float = 1.0
    """Zoom factor of MONAI ``RandSimulateLowResolution`` (1 = off)."""
    gibbs: float = 0.0
    """Gibbs ringing alpha (MONAI ``GibbsNoise``, 0 = off)."""
    noise: float = 0.0
    """Rician noise std relative to the image maximum (MONAI ``RandRicianNoise``)."""

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Apply the artefacts to a (1, H, W) image in [0, 1]; returns it renormalized."""
        from monai.transforms import (
            GaussianSmooth,
            GibbsNoise,
            RandBiasField,
            RandRicianNoise,
            RandSimulateLowResolution,
        )

        scale = image.shape[-1] / 64
        out = torch.as_tensor(image, dtype=torch.float32) ** float(rng.uniform(*self.gamma))
        if self.bias > 0:
            out = _seeded(RandBiasField(coeff_range=(0.6 * self.bias, self.bias), prob=1), rng)(out)
        if self.ghosts > 0:
            out = _ghosting(out, self.ghosts, self.ghost_intensity)
        if self.blur > 0:
            out = GaussianSmooth(self.blur * scale)(out)
        if self.low_res < 1:
            zoom = (self.low_res, min(1.0, self.low_res + 0.1))
            low = RandSimulateLowResolution(prob=1, zoom_range=zoom, upsample_mode="bilinear")
            out = _seeded(low, rng)(out)
        if self.gibbs > 0:
            out = GibbsNoise(alpha=self.gibbs)(out)
        out = torch.as_tensor(out).clamp_min(0)
        if self.noise > 0:
            rician = RandRicianNoise(prob=1, std=self.noise * float(out.max()), sample_std=False)
            out = _seeded(rician, rng)(out)
        return normalize_intensity(np.asarray(torch.as_tensor(out), dtype=np.float32))


def _seeded(transform: RandT, rng: np.random.Generator) -> RandT:
    transform.set_random_state(seed=int(rng.integers(2**31)))
    return transform


def _ghosting(image: torch.Tensor, ghosts: int, intensity: float) -> torch.Tensor:
    """Ghost copies along the first spatial axis: every ``ghosts``-th k-space line is damped."""
    k = torch.fft.fftshift(torch.fft.fft2(image), dim=(-2, -1))
    k[..., ::ghosts, :] *= 1 - intensity
    return torch.fft.ifft2(torch.fft.ifftshift(k, dim=(-2, -1))).abs()
