"""``faz``: OCTA-like en-face phantoms: a capillary mesh around a foveal avascular zone
(grey, binary FAZ), 5 sites."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from fedseg.data.synth.artefacts import adjust, blur, gaussian_noise, vignette
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import blob, curves, smooth_noise, soften


@dataclass(frozen=True)
class FazStyle:
    """Field of view, vessel rendering and artefacts of one simulated OCTA device/site."""

    fov: float
    """Relative field of view: larger shows a smaller FAZ and finer vessels."""
    mesh: float
    """Capillary mesh scale (Gaussian sigma, pixels at 64 px)."""
    vessel: float
    """Vessel brightness."""
    floor: float
    """Background (avascular) brightness."""
    gain: float
    gamma: float
    blur: float
    noise: float
    vignette: float
    stripes: int
    """Horizontal motion-artefact lines per image."""


STYLES = (
    FazStyle(
        fov=1.0,
        mesh=0.9,
        vessel=0.8,
        floor=0.05,
        gain=1.0,
        gamma=1.0,
        blur=0.0,
        noise=0.04,
        vignette=0.2,
        stripes=0,
    ),
    FazStyle(
        fov=1.0,
        mesh=1.1,
        vessel=0.6,
        floor=0.12,
        gain=0.9,
        gamma=1.3,
        blur=0.5,
        noise=0.06,
        vignette=0.4,
        stripes=2,
    ),
    FazStyle(
        fov=1.6,
        mesh=0.7,
        vessel=0.7,
        floor=0.08,
        gain=1.0,
        gamma=0.8,
        blur=0.3,
        noise=0.05,
        vignette=0.3,
        stripes=1,
    ),
    FazStyle(
        fov=1.0,
        mesh=1.0,
        vessel=0.9,
        floor=0.02,
        gain=1.2,
        gamma=1.6,
        blur=0.8,
        noise=0.03,
        vignette=0.6,
        stripes=0,
    ),
    FazStyle(
        fov=0.8,
        mesh=1.4,
        vessel=0.5,
        floor=0.15,
        gain=0.8,
        gamma=0.9,
        blur=1.0,
        noise=0.09,
        vignette=0.2,
        stripes=4,
    ),
)


def sample(style: FazStyle, size: int, rng: np.random.Generator) -> Sample:
    """One OCTA phantom: band-pass noise ridges as capillaries, a few large vessels, and an
    irregular vessel-free zone near the centre."""
    shape = (size, size)
    px = size / 64
    sigma = 1.6 * style.mesh * px / style.fov
    band = ndimage.gaussian_filter(rng.standard_normal(shape), sigma)
    band -= ndimage.gaussian_filter(band, 3 * sigma)
    band /= max(band.std(), 1e-12)
    mesh = np.clip(1 - np.abs(band) / 0.6, 0, 1) ** 1.5  # zero crossings: a mesh of ridges
    cy, cx = size * (0.5 + rng.normal(0, 0.05, 2))
    r = size * rng.uniform(0.07, 0.14) / style.fov
    faz = blob(shape, (cy, cx), (r, r * rng.uniform(0.8, 1.25)), rng, wobble=0.2, harmonics=5)
    k = int(rng.integers(5, 9))
    heads = np.linspace(0, 2 * np.pi, k, endpoint=False) + rng.uniform(0, 2 * np.pi)
    starts = np.column_stack([cy - np.sin(heads) * size * 0.7, cx - np.cos(heads) * size * 0.7])
    large = curves(
        shape,
        starts,
        rng,
        length=size * 0.55,
        width=max(1, round(px)),
        directions=heads,
        wiggle=0.15,
    )
    vessels = np.clip(mesh + 0.7 * large, 0, 1)
    vessels *= 1 - soften(ndimage.binary_dilation(faz, iterations=max(1, round(px))), px)
    lum = style.floor + style.vessel * vessels * (1 + 0.2 * smooth_noise(shape, 8 * px, rng))
    lum *= rng.gamma(12.0, 1 / 12.0, shape)  # speckle
    for row in rng.integers(0, size, style.stripes):
        lum[row : row + max(1, round(px))] += rng.uniform(0.2, 0.5)
    image = (lum * vignette(shape, style.vignette, rng))[None]
    image = adjust(image, gain=style.gain, gamma=style.gamma)
    image = gaussian_noise(blur(image, style.blur * px), style.noise, rng)
    return image, faz.astype(np.uint8)


SYNTH_TASKS.register("faz")(
    SynthTask(
        class_names=("background", "faz"),
        modality="OCT angiography (synthetic)",
        channels=1,
        styles=STYLES,
        sample=sample,
        annotations=("scribble", "point", "block", "box", "scribble2"),
        size_weights=(15.6, 12.2, 14.1, 26.6, 5.5),
        source="synthetic procedural OCTA phantoms (vessel mesh around a foveal avascular "
        "zone) with simulated per-site appearance; not patient data",
    )
)
