"""``brain``: template-derived, simulated multi-site axial T1 slices with grey/white-matter labels.

Images and labels come from nilearn's offline ICBM152 2009 template and its grey- and
white-matter probability maps (``load_mni152_template`` / ``_gm_template`` /
``_wm_template``): label = argmax of [1 - pGM - pWM, pGM, pWM] inside the brain. Subject
variety is simulated by a random in-plane affine per slice and site-specific slice ranges;
sites differ by simulated scanner artefacts (MONAI/torch). All sites come from one
population-average brain: this is not multi-centre data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from fedseg.data.synth.artefacts import ScannerProfile
from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.errors import DataError

BRAIN_THRESHOLD = 0.2
"""Template intensity (of its maximum) above which a voxel is brain (nilearn's own mask)."""


@dataclass(frozen=True)
class BrainStyle:
    """Slice range and scanner artefacts of one simulated site."""

    scanner: ScannerProfile
    z_range: tuple[float, float]
    """Axial slices drawn from this fraction range of the template's height."""


STYLES = (
    BrainStyle(
        scanner=ScannerProfile(name="clean 3T", gamma=(0.9, 1.1), noise=0.01), z_range=(0.30, 0.73)
    ),
    BrainStyle(
        scanner=ScannerProfile(name="bias field 1.5T", bias=0.45, gamma=(1.2, 1.5), noise=0.02),
        z_range=(0.26, 0.64),
    ),
    BrainStyle(
        scanner=ScannerProfile(
            name="low-res ghosting", ghosts=3, ghost_intensity=0.35, low_res=0.7, noise=0.01
        ),
        z_range=(0.37, 0.74),
    ),
    BrainStyle(
        scanner=ScannerProfile(name="noisy", gamma=(0.6, 0.8), noise=0.07), z_range=(0.31, 0.69)
    ),
)


@lru_cache(maxsize=1)
def _template() -> torch.Tensor:
    """(3, X, Y, Z) float32: T1 scaled to [0, 1], pGM, pWM (nilearn's packaged files)."""
    try:
        from nilearn import datasets
    except ImportError:
        raise DataError(
            "the brain task needs nilearn's MNI152 templates: pip install 'fedseg[brain]'"
        ) from None

    volumes = [
        datasets.load_mni152_template(),
        datasets.load_mni152_gm_template(),
        datasets.load_mni152_wm_template(),
    ]
    arrays = [v.get_fdata(dtype=np.float32) for v in volumes]
    arrays[0] /= arrays[0].max()
    return torch.from_numpy(np.stack(arrays))


def _random_affine(rng: np.random.Generator) -> torch.Tensor:
    angle = np.deg2rad(rng.uniform(-10, 10))
    scale = rng.uniform(0.9, 1.1, 2)
    shift = rng.uniform(-0.04, 0.04, 2)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return torch.tensor(np.hstack([rot * scale, shift[:, None]])[None], dtype=torch.float32)


def sample(style: BrainStyle, size: int, rng: np.random.Generator) -> Sample:
    """One axial slice: template slice, random affine, labels, then the site's artefacts."""
    volume = _template()
    depth = volume.shape[-1]
    z = int(rng.integers(round(style.z_range[0] * depth), round(style.z_range[1] * depth)))
    planes = volume[..., z].transpose(1, 2).flip(1)  # rows: anterior at the top
    side = max(planes.shape[1:])
    pad = [
        (side - planes.shape[2]) // 2,
        -(-(side - planes.shape[2]) // 2),
        (side - planes.shape[1]) // 2,
        -(-(side - planes.shape[1]) // 2),
    ]
    planes = F.interpolate(F.pad(planes, pad)[None], size=(size, size), mode="area")
    grid = F.affine_grid(_random_affine(rng), [1, 3, size, size], align_corners=False)
    t1, gm, wm = F.grid_sample(planes, grid, mode="bilinear", align_corners=False)[0]
    label = torch.stack([1 - gm - wm, gm, wm]).argmax(0) * (t1 > BRAIN_THRESHOLD)
    image = style.scanner.apply(t1[None].numpy(), rng)
    return image, label.numpy().astype(np.uint8)


SYNTH_TASKS.register("brain")(
    SynthTask(
        class_names=("background", "grey_matter", "white_matter"),
        modality="MRI T1 (template-derived)",
        channels=1,
        styles=STYLES,
        sample=sample,
        annotations=("full", "full", "full", "full"),
        size_weights=(1.3, 0.7, 1.0, 1.0),
        source="template-derived, simulated multi-site: axial slices of the ICBM152 2009 "
        "template shipped with nilearn (one population-average brain), random affines and "
        "simulated per-site scanner artefacts; not multi-centre data",
    )
)
