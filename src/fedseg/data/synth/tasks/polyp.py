"""``polyp``: endoscopy-like RGB phantoms with one or two polyps (binary), 4 sites."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedseg.data.synth.artefacts import adjust, blur, gaussian_noise, vignette
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import blob, curves, smooth_noise, soften


@dataclass(frozen=True)
class PolypStyle:
    """Appearance of one simulated endoscope/site."""

    mucosa: tuple[float, float, float]
    """RGB colour of the mucosa."""
    polyp_tint: tuple[float, float, float]
    """RGB factors turning mucosa colour into polyp colour."""
    gain: float
    contrast: float
    gamma: float
    blur: float
    noise: float
    vignette: float
    highlights: int
    """Specular highlights per image."""
    round_fov: bool
    """Black outside a circular field of view."""


STYLES = (
    PolypStyle(
        mucosa=(0.85, 0.45, 0.40),
        polyp_tint=(1.05, 0.85, 0.80),
        gain=1.0,
        contrast=1.0,
        gamma=1.0,
        blur=0.0,
        noise=0.02,
        vignette=0.5,
        highlights=4,
        round_fov=False,
    ),
    PolypStyle(
        mucosa=(0.75, 0.50, 0.35),
        polyp_tint=(1.10, 0.80, 0.75),
        gain=0.8,
        contrast=0.8,
        gamma=1.2,
        blur=1.0,
        noise=0.04,
        vignette=0.8,
        highlights=2,
        round_fov=True,
    ),
    PolypStyle(
        mucosa=(0.90, 0.60, 0.55),
        polyp_tint=(0.95, 0.85, 0.90),
        gain=1.1,
        contrast=0.7,
        gamma=0.9,
        blur=0.5,
        noise=0.06,
        vignette=0.3,
        highlights=8,
        round_fov=False,
    ),
    PolypStyle(
        mucosa=(0.70, 0.35, 0.30),
        polyp_tint=(1.15, 0.95, 0.85),
        gain=1.0,
        contrast=1.3,
        gamma=1.1,
        blur=0.0,
        noise=0.02,
        vignette=0.6,
        highlights=5,
        round_fov=True,
    ),
)


def sample(style: PolypStyle, size: int, rng: np.random.Generator) -> Sample:
    """One endoscopy phantom: folded textured mucosa, vessels, polyp(s) and highlights."""
    shape = (size, size)
    px = size / 64
    yy, xx = np.indices(shape) / size
    theta = rng.uniform(0, np.pi)
    period = rng.uniform(0.12, 0.22)
    phase = (xx * np.cos(theta) + yy * np.sin(theta)) / period * 2 * np.pi
    folds = 0.5 + 0.5 * np.sin(phase + 2.5 * smooth_noise(shape, 12 * px, rng))
    lum = 0.65 + 0.08 * smooth_noise(shape, 6 * px, rng) - 0.2 * folds**6
    vessels = curves(shape, rng.uniform(0, size, (6, 2)), rng, length=size * 0.5, width=1)
    lum *= 1 - 0.25 * vessels

    mask = np.zeros(shape, bool)
    polyp_lum = np.zeros(shape)
    for _ in range(1 if rng.random() < 0.85 else 2):
        center = size * rng.uniform(0.25, 0.75, 2)
        ry = size * rng.uniform(0.08, 0.22)
        radii = (ry, ry * rng.uniform(0.75, 1.3))
        one = blob(shape, center, radii, rng, angle=rng.uniform(0, np.pi), wobble=0.15)
        # dome shading lit from a random side, with finer texture than the mucosa
        light = rng.uniform(0, 2 * np.pi)
        grad = (xx * size - center[1]) * np.cos(light) + (yy * size - center[0]) * np.sin(light)
        polyp_lum = np.maximum(polyp_lum, one * (0.75 - 0.2 * grad / max(radii)))
        mask |= one
    polyp_lum += 0.06 * smooth_noise(shape, 1.5 * px, rng)
    soft = soften(mask, 0.8 * px)
    mucosa = lum[None] * np.asarray(style.mucosa)[:, None, None]
    polyp = (
        polyp_lum[None] * (np.asarray(style.mucosa) * np.asarray(style.polyp_tint))[:, None, None]
    )
    image = (1 - soft) * mucosa + soft * polyp
    for _ in range(style.highlights):
        on_polyp = rng.random() < 0.5 and mask.any()
        ys, xs = (
            np.nonzero(mask) if on_polyp else (rng.uniform(0, size, 1), rng.uniform(0, size, 1))
        )
        k = rng.integers(len(ys))
        spot = blob(
            shape, (ys[k], xs[k]), (px * rng.uniform(0.7, 2), px * rng.uniform(0.7, 2)), rng
        )
        image = np.maximum(image, soften(spot, 0.5 * px)[None])
    image = image * vignette(shape, style.vignette, rng)
    image = adjust(image, gain=style.gain, contrast=style.contrast, gamma=style.gamma)
    image = gaussian_noise(blur(image, style.blur * px), style.noise, rng)
    if style.round_fov:  # nothing is visible, or labeled, outside the circular view
        fov = (yy - 0.5) ** 2 + (xx - 0.5) ** 2 <= 0.26
        image, mask = image * fov[None], mask & fov
    return image, mask.astype(np.uint8)


SYNTH_TASKS.register("polyp")(
    SynthTask(
        class_names=("background", "polyp"),
        modality="endoscopy (synthetic)",
        channels=3,
        styles=STYLES,
        sample=sample,
        annotations=("point", "scribble", "rotated_box", "block"),
        size_weights=(23.5, 18.1, 13.0, 30.0),
        source="synthetic procedural polyp phantoms with simulated per-site appearance; "
        "not patient data",
    )
)
