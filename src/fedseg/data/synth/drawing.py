"""Procedural shapes for synthetic phantoms: irregular blobs, smooth noise, curvy lines."""

from __future__ import annotations

import cv2
import numpy as np
from scipy import ndimage

__all__ = ["blob", "curves", "smooth_noise", "soften"]


def blob(
    shape: tuple[int, int],
    center: tuple[float, float],
    radii: tuple[float, float],
    rng: np.random.Generator,
    *,
    angle: float = 0.0,
    wobble: float = 0.1,
    harmonics: int = 4,
) -> np.ndarray:
    """Boolean ellipse (centre (y, x), radii (ry, rx) in pixels, ``angle`` in radians) whose
    radius is modulated by random low-order harmonics of relative amplitude ``wobble``."""
    yy, xx = np.indices(shape, dtype=np.float64)
    dy, dx = yy - center[0], xx - center[1]
    cos, sin = np.cos(angle), np.sin(angle)
    u, v = (dx * cos + dy * sin) / radii[1], (-dx * sin + dy * cos) / radii[0]
    theta = np.arctan2(v, u)
    scale = np.ones(shape)
    for k in range(2, harmonics + 2):
        scale += wobble / (k - 1) * rng.uniform(-1, 1) * np.cos(k * theta + rng.uniform(0, 6.3))
    return np.hypot(u, v) <= scale


def smooth_noise(shape: tuple[int, ...], sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian-filtered white noise rescaled to zero mean and unit standard deviation."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma, mode="wrap")
    return (field - field.mean()) / max(field.std(), 1e-12)


def soften(mask: np.ndarray, sigma: float) -> np.ndarray:
    """A boolean mask blurred into a soft [0, 1] map (for smooth intensity edges)."""
    return ndimage.gaussian_filter(mask.astype(np.float64), max(sigma, 1e-3))


def curves(
    shape: tuple[int, int],
    starts: np.ndarray,
    rng: np.random.Generator,
    *,
    length: float,
    width: int,
    wiggle: float = 0.35,
    steps: int = 12,
    directions: np.ndarray | None = None,
) -> np.ndarray:
    """Float map in [0, 1] of random smooth curves drawn from ``starts`` (k, 2) as (y, x):
    random walks of ``steps`` segments totalling ``length`` pixels, heading along
    ``directions`` (radians, default random) with turning noise ``wiggle``."""
    canvas = np.zeros(shape, np.float32)
    heading = rng.uniform(0, 2 * np.pi, len(starts)) if directions is None else directions
    for (y, x), h in zip(starts, heading, strict=True):
        points = [(x, y)]
        for _ in range(steps):
            h += rng.normal(0, wiggle)
            x, y = x + np.cos(h) * length / steps, y + np.sin(h) * length / steps
            points.append((x, y))
        poly = np.round(np.asarray(points) * 16).astype(np.int32)
        cv2.polylines(canvas, [poly], False, 1.0, max(1, width), cv2.LINE_AA, shift=4)
    return canvas
