"""``fundus``: optic disc/cup phantoms (RGB, classes background / cup / rim), 5 sites."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from fedseg.data.synth.artefacts import adjust, blur, gaussian_noise, vignette
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import blob, curves, smooth_noise, soften


@dataclass(frozen=True)
class FundusStyle:
    """Appearance of one simulated fundus camera/site."""

    tint: tuple[float, float, float]
    """RGB reflectance of the retina."""
    gain: float
    contrast: float
    gamma: float
    blur: float
    """Gaussian sigma in pixels at 64 px."""
    noise: float
    vignette: float
    pallor: float
    """How much brighter the disc is than the retina."""
    haze: float
    """Additive white veil (lowers contrast)."""
    spots: int
    """Dark dust spots per image."""


STYLES = (
    FundusStyle(
        tint=(1.0, 0.52, 0.30),
        gain=1.0,
        contrast=1.0,
        gamma=1.0,
        blur=0.0,
        noise=0.02,
        vignette=0.35,
        pallor=0.35,
        haze=0.0,
        spots=0,
    ),
    FundusStyle(
        tint=(0.80, 0.42, 0.45),
        gain=0.75,
        contrast=0.8,
        gamma=1.3,
        blur=1.2,
        noise=0.02,
        vignette=0.6,
        pallor=0.25,
        haze=0.0,
        spots=3,
    ),
    FundusStyle(
        tint=(1.0, 0.80, 0.35),
        gain=1.1,
        contrast=1.2,
        gamma=0.8,
        blur=0.0,
        noise=0.06,
        vignette=0.2,
        pallor=0.3,
        haze=0.1,
        spots=0,
    ),
    FundusStyle(
        tint=(0.60, 0.50, 0.58),
        gain=0.9,
        contrast=0.6,
        gamma=1.0,
        blur=0.6,
        noise=0.03,
        vignette=0.9,
        pallor=0.2,
        haze=0.2,
        spots=0,
    ),
    FundusStyle(
        tint=(0.95, 0.38, 0.18),
        gain=1.0,
        contrast=1.4,
        gamma=1.2,
        blur=0.8,
        noise=0.04,
        vignette=0.4,
        pallor=0.45,
        haze=0.0,
        spots=5,
    ),
)


def sample(style: FundusStyle, size: int, rng: np.random.Generator) -> Sample:
    """One fundus phantom: disc (rim) and cup ellipses with vessels, in the site's style."""
    shape = (size, size)
    px = size / 64
    cy, cx = size * (0.5 + rng.uniform(-0.12, 0.12, 2))
    rx = size * rng.uniform(0.17, 0.28)
    ry, angle = rx * rng.uniform(0.85, 1.15), rng.uniform(0, np.pi)
    disc = blob(shape, (cy, cx), (ry, rx), rng, angle=angle, wobble=0.06)
    ratio = rng.uniform(0.35, 0.7)
    offset = rng.normal(0, 0.08, 2) * (ry, rx)
    cup = blob(
        shape,
        (cy + offset[0], cx + offset[1]),
        (ry * ratio, rx * ratio),
        rng,
        angle=angle,
        wobble=0.08,
    )
    cup &= ndimage.binary_erosion(disc, iterations=max(1, round(px)))
    mask = np.where(cup, 1, np.where(disc, 2, 0)).astype(np.uint8)

    lum = 0.45 + 0.06 * smooth_noise(shape, 5 * px, rng)
    lum += style.pallor * soften(disc, 1.2 * px) + 0.25 * soften(cup, 2.0 * px)
    k = int(rng.integers(5, 9))
    heads = np.linspace(0, 2 * np.pi, k, endpoint=False) + rng.uniform(0, 2 * np.pi)
    starts = np.tile([cy, cx], (k, 1)) + rng.normal(0, 0.1 * rx, (k, 2))
    width = max(1, round(px * rng.uniform(1, 2.5)))
    vessels = curves(shape, starts, rng, length=size * 0.8, width=width, directions=heads)
    lum *= 1 - 0.45 * ndimage.gaussian_filter(vessels, 0.5 * px)
    image = lum[None] * np.asarray(style.tint)[:, None, None]
    image = image * vignette(shape, style.vignette, rng) + style.haze
    for _ in range(style.spots):
        spot = blob(shape, tuple(rng.uniform(0, size, 2)), (2 * px, 2 * px), rng)
        image *= 1 - 0.4 * soften(spot, px)
    image = adjust(image, gain=style.gain, contrast=style.contrast, gamma=style.gamma)
    image = gaussian_noise(blur(image, style.blur * px), style.noise, rng)
    return image, mask


SYNTH_TASKS.register("fundus")(
    SynthTask(
        class_names=("background", "cup", "rim"),
        modality="fundus photograph (synthetic)",
        channels=3,
        styles=STYLES,
        sample=sample,
        annotations=("scribble", "scribble2", "box", "point", "block"),
        size_weights=(7.1, 9.9, 17.9, 17.9, 10.0),
        regions={"cup": [1], "disc": [1, 2]},
        box_conversion="scribble",
        source="synthetic procedural optic disc/cup phantoms with simulated per-site "
        "appearance; not patient data",
    )
)
