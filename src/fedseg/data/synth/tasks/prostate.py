"""``prostate``: T2-MRI-like axial pelvis phantoms (grey, binary prostate), 6 sites."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from fedseg.data.synth.artefacts import ScannerProfile
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import blob, smooth_noise


@dataclass(frozen=True)
class ProstateStyle:
    """Anatomy scale, tissue contrast and scanner artefacts of one simulated site."""

    scanner: ScannerProfile
    zoom: float
    """Field-of-view scale of the anatomy."""
    gland: float
    """Central-gland intensity (the peripheral zone is brighter)."""
    coil: float
    """Endorectal-coil signal boost near the rectum (0 = no coil)."""


STYLES = (
    ProstateStyle(
        scanner=ScannerProfile(name="reference", noise=0.02), zoom=1.0, gland=0.38, coil=0.0
    ),
    ProstateStyle(
        scanner=ScannerProfile(name="bias field", bias=0.4, gamma=(1.2, 1.5), noise=0.03),
        zoom=0.85,
        gland=0.42,
        coil=0.0,
    ),
    ProstateStyle(
        scanner=ScannerProfile(
            name="low-res ghosting", ghosts=4, ghost_intensity=0.3, low_res=0.55, noise=0.02
        ),
        zoom=1.15,
        gland=0.32,
        coil=0.0,
    ),
    ProstateStyle(
        scanner=ScannerProfile(name="endorectal coil", gamma=(0.7, 0.9), noise=0.05),
        zoom=1.0,
        gland=0.45,
        coil=0.9,
    ),
    ProstateStyle(
        scanner=ScannerProfile(name="noisy blurred", blur=1.0, noise=0.08, gamma=(0.9, 1.1)),
        zoom=0.9,
        gland=0.35,
        coil=0.5,
    ),
    ProstateStyle(
        scanner=ScannerProfile(name="gibbs", gibbs=0.4, bias=0.25, noise=0.03),
        zoom=1.25,
        gland=0.40,
        coil=0.0,
    ),
)


def sample(style: ProstateStyle, size: int, rng: np.random.Generator) -> Sample:
    """One axial slice: body with fat rim, femoral heads, rectum, optional bladder, prostate."""
    shape = (size, size)
    px = size / 64
    z = style.zoom * size
    cy, cx = size * (0.5 + rng.normal(0, 0.02, 2))
    body = blob(shape, (cy, cx), (0.36 * z, 0.47 * z), rng, wobble=0.04)
    fat = body & ~ndimage.binary_erosion(body, iterations=max(1, round(0.06 * z)))
    lum = np.where(body, 0.30 + 0.04 * smooth_noise(shape, 2 * px, rng), 0.0)
    lum = np.where(fat, 0.75, lum)
    for side in (-1, 1):  # femoral heads: bright marrow, dark cortex
        head = blob(shape, (cy + 0.05 * z, cx + side * 0.3 * z), (0.08 * z, 0.08 * z), rng)
        lum = np.where(ndimage.binary_dilation(head, iterations=max(1, round(px))), 0.08, lum)
        lum = np.where(head, 0.6, lum)

    py, pcx = cy + rng.normal(0, 0.03) * z, cx + rng.normal(0, 0.03) * z
    ry = z * rng.uniform(0.07, 0.14)
    prostate = blob(
        shape, (py, pcx), (ry, ry * rng.uniform(1.0, 1.4)), rng, wobble=0.12, harmonics=3
    )
    rectum_c = (py + ry + 0.07 * z, pcx)
    rectum = blob(shape, rectum_c, (0.06 * z, 0.08 * z), rng, wobble=0.1)
    if rng.random() < 0.4:
        bladder = blob(shape, (py - ry - 0.1 * z, pcx), (0.09 * z, 0.14 * z), rng)
        lum = np.where(bladder & body, 0.95, lum)
    gland = blob(shape, (py - 0.2 * ry, pcx), (0.6 * ry, 0.75 * ry), rng, wobble=0.15)
    tissue = np.where(gland, style.gland, 0.55) + 0.05 * smooth_noise(shape, 0.7 * px, rng)
    capsule = ndimage.binary_dilation(prostate, iterations=max(1, round(px))) & ~prostate
    lum = np.where(capsule, 0.2, lum)
    lum = np.where(prostate, tissue, lum)
    lum = np.where(rectum, 0.1, lum)
    if style.coil > 0:
        yy, xx = np.indices(shape)
        dist = np.hypot(yy - rectum_c[0], xx - rectum_c[1]) / z
        lum = lum * (1 + style.coil * np.exp(-dist / 0.12)) * body
    image = ndimage.gaussian_filter(lum, 0.5 * px)[None].astype(np.float32)
    return style.scanner.apply(np.clip(image, 0, None), rng), prostate.astype(np.uint8)


SYNTH_TASKS.register("prostate")(
    SynthTask(
        class_names=("background", "prostate"),
        modality="MRI T2-like (synthetic)",
        channels=1,
        styles=STYLES,
        sample=sample,
        annotations=("block", "point", "scribble", "point", "scribble2", "box"),
        size_weights=(18.4, 17.2, 19.3, 11.6, 13.9, 11.0),
        source="synthetic procedural pelvis phantoms with simulated per-site scanner "
        "artefacts; not patient data",
        paper_sites=("RUNMC", "BMC", "HCRUDB", "UCL", "BIDMC", "HK"),
    )
)
