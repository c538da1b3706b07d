"""``nuclei``: H&E-like histology tiles (RGB, binary nuclei), 4 sites as FedBCS's nuclei task.

Colour follows the Beer-Lambert stain model used for stain normalisation (Macenko et al.,
2009): a pixel's optical density is ``c_H * h + c_E * e`` for the hematoxylin and eosin
stain vectors ``h`` and ``e`` and the per-pixel stain concentrations; the RGB value is
``exp(-OD)``. Sites differ in stain vectors and strength, nucleus density and size, scanner
blur and noise, the way TCIA, CRC, KIRC and TNBC differ in the FedBCS paper's Fig. 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from fedseg.data.synth.artefacts import blur, gaussian_noise
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import blob, smooth_noise


@dataclass(frozen=True)
class NucleiStyle:
    """Stain, tissue and scanner appearance of one simulated histology site."""

    hematoxylin: tuple[float, float, float]
    """Optical-density RGB vector of hematoxylin (nuclei; blue-purple)."""
    eosin: tuple[float, float, float]
    """Optical-density RGB vector of eosin (stroma and cytoplasm; pink)."""
    stain: float
    """Overall stain strength (concentration scale)."""
    density: float
    """Nuclei per 100 square pixels at 64 px (tiles are scaled, so density is per area)."""
    radius: tuple[float, float]
    """Range of nucleus radii in pixels at 64 px."""
    clustering: float
    """Fraction of nuclei placed next to an earlier one (touching clumps)."""
    blur: float
    """Scanner focus blur, Gaussian sigma in pixels at 64 px."""
    noise: float


STYLES = (
    NucleiStyle(  # TCIA: stomach adenocarcinoma, crisp, standard H&E
        hematoxylin=(0.65, 0.70, 0.29),
        eosin=(0.07, 0.99, 0.11),
        stain=1.0,
        density=0.9,
        radius=(1.4, 2.4),
        clustering=0.3,
        blur=0.3,
        noise=0.015,
    ),
    NucleiStyle(  # CRC: colorectal, dense glands of crowded nuclei, darker stain
        hematoxylin=(0.55, 0.78, 0.30),
        eosin=(0.10, 0.90, 0.30),
        stain=1.35,
        density=1.4,
        radius=(1.2, 2.0),
        clustering=0.6,
        blur=0.6,
        noise=0.02,
    ),
    NucleiStyle(  # KIRC: clear-cell carcinoma, sparse small nuclei in pale cytoplasm
        hematoxylin=(0.70, 0.65, 0.30),
        eosin=(0.05, 0.80, 0.45),
        stain=0.7,
        density=0.5,
        radius=(1.0, 1.8),
        clustering=0.15,
        blur=0.2,
        noise=0.02,
    ),
    NucleiStyle(  # TNBC: breast, large pleomorphic nuclei, purple cast, out of focus
        hematoxylin=(0.50, 0.75, 0.45),
        eosin=(0.20, 0.85, 0.35),
        stain=1.15,
        density=0.8,
        radius=(1.8, 3.2),
        clustering=0.45,
        blur=1.0,
        noise=0.03,
    ),
)


def _unit(v: tuple[float, float, float]) -> np.ndarray:
    a = np.asarray(v, np.float64)
    return a / np.linalg.norm(a)


def sample(style: NucleiStyle, size: int, rng: np.random.Generator) -> Sample:
    """One tile: fibrous eosin stroma, many small (often touching) textured nuclei."""
    shape = (size, size)
    px = size / 64
    count = rng.poisson(style.density * size * size / 100 / px**2)
    mask = np.zeros(shape, bool)
    chromatin = np.zeros(shape)
    centres: list[np.ndarray] = []
    for _ in range(count):
        r = px * rng.uniform(*style.radius)
        if centres and rng.random() < style.clustering:  # touch an earlier nucleus
            angle = rng.uniform(0, 2 * np.pi)
            c = centres[rng.integers(len(centres))] + 1.8 * r * np.array(
                [np.sin(angle), np.cos(angle)]
            )
        else:
            c = rng.uniform(0, size, 2)
        centres.append(c)
        one = blob(shape, (c[0], c[1]), (r, r * rng.uniform(0.6, 1.0)), rng,
                   angle=rng.uniform(0, np.pi), wobble=0.15, harmonics=2)  # fmt: skip
        mask |= one
        chromatin = np.maximum(chromatin, one * rng.uniform(0.7, 1.0))
    texture = smooth_noise(shape, 0.5 * px, rng)
    fibres = smooth_noise(shape, (0.6 * px, 3 * px), rng)  # elongated collagen fibres
    conc_h = style.stain * (0.05 + chromatin * (0.9 + 0.25 * texture))
    conc_e = style.stain * np.clip(0.35 + 0.15 * fibres, 0.05, None) * (1 - 0.6 * mask)
    conc_e = conc_e * (smooth_noise(shape, 6 * px, rng) > -1.2)  # a few empty lumina
    od = (
        conc_h[None] * _unit(style.hematoxylin)[:, None, None]
        + conc_e[None] * _unit(style.eosin)[:, None, None]
    )
    image = np.exp(-od).astype(np.float32)
    image = gaussian_noise(blur(image, style.blur * px), style.noise, rng)
    return image, ndimage.binary_fill_holes(mask).astype(np.uint8)


SYNTH_TASKS.register("nuclei")(
    SynthTask(
        class_names=("background", "nuclei"),
        modality="histology H&E-like (synthetic)",
        channels=3,
        styles=STYLES,
        sample=sample,
        annotations=("point", "scribble", "box", "scribble2"),
        size_weights=(97.0, 200.0, 462.0, 50.0),
        source="synthetic procedural H&E-like tiles (Beer-Lambert stain model) with per-site "
        "stain, density and scanner blur in the proportions of FedBCS's TCIA/CRC/KIRC/TNBC "
        "sites; not patient data",
        paper_sites=("TCIA", "CRC", "KIRC", "TNBC"),
    )
)
