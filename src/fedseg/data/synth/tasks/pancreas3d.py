"""``pancreas3d``: abdominal MRI-like volumes with a small pancreas (binary), 7 sites.

Mirrors the federation of Pan et al. (ICASSP 2025, Table 1): seven centres holding T1- and
T2-weighted volumes in the paper's proportions and sizes (two tiny centres). Each volume is a
procedural abdomen (body wall, fat, liver, spleen, kidneys, stomach, spine, aorta/IVC,
duodenum, bowel loops) with a thin, curved, lobulated pancreas whose position, length,
thickness and tilt vary. Sites differ in intensity scale and gamma, bias field, blur,
Rician noise and voxel spacing. ``pancreas3d_t1`` / ``pancreas3d_t2`` hold one contrast
only, like the paper's two experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import ndimage

from fedseg.data.synth.base import SYNTH_TASKS, Sample, SynthTask
from fedseg.data.synth.drawing import smooth_noise

__all__ = ["STYLES", "TABLE1", "PancreasStyle", "sample", "spacing", "spatial_shape"]

TABLE1 = {
    "NYU": (162, 162),
    "MCF": (148, 143),
    "NU": (206, 207),
    "AHN": (17, 27),
    "MCA": (25, 23),
    "IU": (74, 73),
    "EMC": (91, 103),
}
"""Paper Table 1: (T1, T2) volumes per centre; sets site sizes and contrast mix."""

# (T1, T2) intensity of each tissue before site effects.
TISSUE = {
    "fat": (0.85, 0.65),
    "muscle": (0.35, 0.25),
    "liver": (0.55, 0.30),
    "spleen": (0.40, 0.60),
    "kidney": (0.45, 0.65),
    "pancreas": (0.70, 0.45),
    "bowel": (0.62, 0.50),
    "fluid": (0.12, 0.95),
    "vessel": (0.22, 0.06),
    "bone": (0.55, 0.40),
}


@dataclass(frozen=True)
class PancreasStyle:
    """Acquisition of one simulated centre."""

    t1_fraction: float
    """Share of T1-like volumes (the rest are T2-like)."""
    gain: float
    """Intensity scale (arbitrary MR units differ between scanners)."""
    offset: float
    gamma: float
    bias: float
    """Strength of the smooth multiplicative bias field (log-amplitude)."""
    blur: float
    """In-plane Gaussian blur sigma in voxels at 64 px."""
    noise: float
    """Rician noise std relative to the fat intensity."""
    fov: float
    """In-plane field of view in mm (spacing = fov / size)."""
    slab: float
    """Cranio-caudal coverage in mm (spacing = slab / depth)."""


# gain, offset, gamma, bias, blur, noise, fov, slab: the two tiny centres are the noisiest.
_ACQUISITION = {
    "NYU": (1.0, 0.0, 1.0, 0.15, 0.0, 0.03, 380.0, 200.0),
    "MCF": (1.3, 0.05, 0.85, 0.25, 0.5, 0.04, 400.0, 220.0),
    "NU": (0.8, 0.0, 1.15, 0.1, 0.3, 0.02, 360.0, 190.0),
    "AHN": (1.6, 0.1, 0.7, 0.45, 1.0, 0.09, 420.0, 240.0),
    "MCA": (0.6, 0.0, 1.4, 0.35, 0.8, 0.08, 440.0, 250.0),
    "IU": (1.1, -0.05, 1.05, 0.2, 0.4, 0.05, 390.0, 210.0),
    "EMC": (0.9, 0.02, 0.9, 0.3, 0.2, 0.04, 370.0, 230.0),
}
STYLES = tuple(
    PancreasStyle(t1 / (t1 + t2), *_ACQUISITION[name]) for name, (t1, t2) in TABLE1.items()
)


def spatial_shape(size: int) -> tuple[int, int, int]:
    """(D, H, W) = (max(16, size // 2), size, size): 32x64x64 at the default size; the depth
    never drops below 16 so that the 4-level UNet can pool it."""
    return (max(16, size // 2), size, size)


def spacing(style: PancreasStyle, size: int) -> tuple[float, float, float]:
    """Voxel spacing in mm (D, H, W axes) of a site's volumes at ``size``."""
    depth = spatial_shape(size)[0]
    return (style.slab / depth, style.fov / size, style.fov / size)


def _ellipsoid(grid: np.ndarray, centre: tuple[float, ...], radii: tuple[float, ...]) -> np.ndarray:
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid, centre, radii, strict=True)) <= 1


def _tube(
    grid: np.ndarray, points: np.ndarray, radii: np.ndarray, wobble: np.ndarray | float = 0.0
) -> np.ndarray:
    """Voxels within the (anisotropic, per-point) radii of a sampled 3D curve."""
    best = np.full(grid.shape[1:], np.inf)
    for p, r in zip(points, radii, strict=True):
        d = sum(((g - c) / rr) ** 2 for g, c, rr in zip(grid, p, r, strict=True))
        np.minimum(best, d, out=best)
    return best <= (1.0 + wobble) ** 2


def _bezier(ctrl: list[list[float]], n: int) -> np.ndarray:
    """``n`` points of the quadratic Bezier curve through control points ``ctrl`` (3, 3)."""
    c = np.asarray(ctrl)
    t = np.linspace(0, 1, n)[:, None]
    return (1 - t) ** 2 * c[0] + 2 * (1 - t) * t * c[1] + t**2 * c[2]


def _organs(grid: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Tissue masks named ``<tissue>.<structure>``, painted in insertion order.

    Normalised coordinates in [-1, 1]: z cranial to caudal, y anterior to posterior, x patient
    right to left (radiological view).
    """
    z, y, x = grid

    def j(s: float = 0.03) -> float:
        return float(rng.normal(0, s))

    ry, rx = 0.72 + j(), 0.9 + j()
    ring = [(y / (ry - d)) ** 2 + (x / (rx - d)) ** 2 for d in (0.0, 0.07, 0.13)]
    t = {"fat": ring[0] <= 1 + 0.03 * z, "muscle": (ring[1] <= 1) & (ring[2] > 1)}
    t["fat.inner"] = ring[2] <= 1
    t["liver"] = _ellipsoid(grid, (-0.5 + j(0.1), -0.1 + j(), -0.45 + j()), (0.9, 0.42, 0.36))
    t["spleen"] = _ellipsoid(grid, (-0.45 + j(0.1), 0.2 + j(), 0.62 + j()), (0.45, 0.2, 0.14))
    stomach = (-0.6 + j(0.1), -0.3 + j(), 0.32 + j())
    t["muscle.stomach_wall"] = _ellipsoid(grid, stomach, (0.4, 0.22, 0.2))
    t["fluid.stomach"] = _ellipsoid(grid, stomach, (0.33, 0.16, 0.14))
    for side, sx in (("right", -1), ("left", 1)):
        centre = (0.25 + j(0.1), 0.38 + j(), sx * 0.42 + j())
        t[f"kidney.{side}"] = _ellipsoid(grid, centre, (0.55, 0.16, 0.11))
    t["bone.spine"] = (y - 0.56) ** 2 + x**2 <= 0.13**2
    t["fluid.canal"] = (y - 0.6) ** 2 + x**2 <= 0.045**2
    t["vessel.aorta"] = (y - 0.33) ** 2 + (x - 0.08) ** 2 <= 0.055**2
    t["vessel.ivc"] = (y - 0.3) ** 2 + ((x + 0.13) / 1.3) ** 2 <= 0.055**2
    for i in range(int(rng.integers(3, 7))):  # bowel loops: pancreas-like distractors
        centre = (rng.uniform(-0.2, 0.9), rng.uniform(-0.5, 0.0), rng.uniform(-0.5, 0.6))
        t[f"bowel.{i}"] = _ellipsoid(grid, centre, tuple(rng.uniform(0.06, 0.14, 3) * (2, 1, 1)))
    return t


def _pancreas(
    grid: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The gland (head by the duodenum, body over the vessels, tail towards the spleen) and
    its neighbours (duodenum, splenic vein). Size, position, tilt and lobulation vary."""
    scale = rng.uniform(0.75, 1.3)  # atrophic to bulky
    z0, tilt = rng.uniform(-0.25, 0.15), rng.uniform(0.1, 0.35)
    jy, jx = rng.normal(0, 0.04, 3), rng.normal(0, 0.05, 3)
    ctrl = [
        [z0 + 0.05, 0.08 + jy[0], -0.2 + jx[0]],
        [z0, 0.14 + jy[1], 0.08 + jx[1]],
        [z0 - tilt, 0.16 + jy[2], 0.42 + jx[2]],
    ]
    points = _bezier(ctrl, 48)
    radii = scale * np.linspace(1.0, 0.55, 48)[:, None] * np.array([0.2, 0.095, 0.09])
    lobules = 0.25 * smooth_noise(grid.shape[1:], max(1.0, grid.shape[-1] / 24), rng)
    gland = _tube(grid, points, radii, lobules)
    duodenum = [[z0 - 0.05, -0.05, -0.22], [z0 + 0.25, 0.1, -0.42], [z0 + 0.35, 0.22, -0.15]]
    near = {
        "bowel.duodenum": _tube(grid, _bezier(duodenum, 32), np.tile([0.2, 0.06, 0.06], (32, 1))),
        "vessel.splenic_vein": _tube(
            grid,
            points + np.array([0.0, 0.07 * scale, 0.0]),
            np.tile([0.08, 0.025, 0.025], (48, 1)),
        ),
    }
    return gland, {k: v & ~gland for k, v in near.items()}


def _anatomy(
    shape: tuple[int, int, int], rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Tissue masks (painted in order) and the pancreas mask of one abdomen."""
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    tissues = _organs(grid, rng)
    gland, near = _pancreas(grid, rng)
    tissues.update(near)
    inside = tissues["fat.inner"]
    for name in tissues:
        if name not in ("fat", "muscle", "fat.inner"):
            tissues[name] &= inside
    return tissues, gland & inside


def sample(style: PancreasStyle, size: int, rng: np.random.Generator) -> Sample:
    """One volume (1, D, H, W) and its pancreas mask (D, H, W) of a site."""
    shape = spatial_shape(size)
    tissues, pancreas = _anatomy(shape, rng)
    contrast = 0 if rng.random() < style.t1_fraction else 1
    image = np.zeros(shape)
    for name, mask in tissues.items():
        role = name.split(".")[0]
        base = TISSUE[role][contrast]
        if role == "bowel":
            base += rng.uniform(-0.12, 0.12)
        image[mask] = base
    image[pancreas] = TISSUE["pancreas"][contrast] * rng.uniform(0.9, 1.1)
    texture = 1 + 0.06 * smooth_noise(shape, 1.0, rng)
    image = ndimage.gaussian_filter(image * texture, 0.6)  # partial-volume edges
    bias = np.exp(style.bias * smooth_noise(shape, shape[-1] / 3, rng))
    image = np.clip(image * bias, 0, None) ** style.gamma
    if style.blur > 0:
        sigma = style.blur * size / 64
        image = ndimage.gaussian_filter(image, (0.3 * sigma, sigma, sigma))
    std = style.noise * TISSUE["fat"][contrast]
    image = np.hypot(image + rng.normal(0, std, shape), rng.normal(0, std, shape))  # Rician
    image = style.gain * image + style.offset
    return image[None].astype(np.float32), pancreas.astype(np.uint8)


def _task(styles: tuple[PancreasStyle, ...], what: str, counts: int) -> SynthTask[PancreasStyle]:
    """The task with ``styles``; site sizes from Table 1 column(s) ``counts`` (0 T1, 1 T2,
    2 both)."""
    sizes = tuple(float(sum(v) if counts == 2 else v[counts]) for v in TABLE1.values())
    return SynthTask(
        class_names=("background", "pancreas"),
        modality=f"abdominal MRI, {what} (synthetic)",
        channels=1,
        styles=styles,
        sample=sample,
        annotations=("full",) * len(styles),
        size_weights=sizes,
        spatial_shape=spatial_shape,
        spacing=spacing,
        source="synthetic procedural abdominal MRI-like volumes (7 simulated centres sized "
        "like Pan et al. ICASSP 2025 Table 1); not patient data",
    )


SYNTH_TASKS.register("pancreas3d")(_task(STYLES, "T1- and T2-weighted", 2))
SYNTH_TASKS.register("pancreas3d_t1")(
    _task(tuple(replace(s, t1_fraction=1.0) for s in STYLES), "T1-weighted", 0)
)
SYNTH_TASKS.register("pancreas3d_t2")(
    _task(tuple(replace(s, t1_fraction=0.0) for s in STYLES), "T2-weighted", 1)
)
