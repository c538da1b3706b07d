"""Point, scribble, scribble2 and block labels synthesized from a full 2D mask (paper Sec. IV-A).

Every function maps a mask (H, W) of class indices to a label of the same shape holding class
indices on labeled pixels and ``IGNORE_INDEX`` elsewhere. Every class present in the mask,
background included, and every connected component of it, gets labeled pixels; point, scribble
and block pixels always lie inside their own class region.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage
from skimage.morphology import disk, skeletonize

from fedseg.data.manifest import IGNORE_INDEX
from fedseg.data.weak.params import WeakLabelParams

__all__ = ["block_label", "max_inscribed_rect", "point_label", "scribble2_label", "scribble_label"]

_COARSE = 64
"""The inscribed-rectangle search runs on a grid of at most this many cells per side."""


def point_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Points: midpoints of the sides of each object's maximal inscribed rectangle shrunk by a
    random ratio, stamped with a Gaussian-shaped brush; background points on the horizontal and
    vertical axes through the foreground, outside its bounding box."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    radius = p.pixels(p.brush, mask.shape)
    for c in _present(mask, foreground=True):
        region_c = mask == c
        comps, _ = ndimage.label(region_c)
        for k, window in enumerate(ndimage.find_objects(comps), start=1):
            region = comps[window] == k
            r0, c0, r1, c1 = max_inscribed_rect(region)
            ratio = rng.uniform(*p.point_shrink)
            cy, cx = (r0 + r1) / 2, (c0 + c1) / 2
            hy, hx = (r1 - r0) / 2 * ratio, (c1 - c0) / 2 * ratio
            for dy, dx in ((-hy, 0), (hy, 0), (0, -hx), (0, hx)):
                y = window[0].start + round(cy + dy)
                x = window[1].start + round(cx + dx)
                _stamp(out, region_c, (y, x), c, radius, rng)
    if (mask == 0).any():
        _background_points(out, mask, radius, rng, p)
    return out


def scribble_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Scribbles: the skeleton of a depth band eroded out of each object (a closed curve inside
    it; for an object with a hole, such as a rim, the skeleton of the whole eroded object, a
    single curve along it) and of a ring around the foreground for the background, drawn with
    a round brush."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    radius = p.pixels(p.brush, mask.shape)
    lo, hi = p.scribble_band
    fg = mask > 0
    for c in _present(mask, foreground=True):
        region = mask == c
        depth, comps = _relative_depth(region)
        holed = np.concatenate([[False], _has_hole(comps)])[comps]
        curve = skeletonize((depth > lo) & ((depth <= hi) | holed))
        _paint(out, curve, region, c, radius)
        _label_unlabeled_components(out, comps, depth, c, radius)
    if (mask == 0).any():
        bg = mask == 0
        if fg.any():
            dist = ndimage.distance_transform_edt(bg)
            eq_radius = math.sqrt(fg.sum() / math.pi)
            g0, g1 = p.scribble_bg_ring
            ring = (dist > g0 * eq_radius + radius) & (dist <= g1 * eq_radius + 2 * radius + 1)
            _paint(out, skeletonize(ring), bg, 0, radius)
            depth, comps = dist / dist.max(), ndimage.label(bg)[0]
        else:
            depth, comps = _relative_depth(bg)
            _paint(out, skeletonize((depth > lo) & (depth <= hi)), bg, 0, radius)
        _label_unlabeled_components(out, comps, depth, 0, radius)
    return out


def scribble2_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Scribbles of another style: ``scribble_label`` warped by a smooth random elastic field
    (at most ``elastic_alpha`` per axis, so labels may leave their object by at most
    ``ceil(alpha_px + 0.5)`` pixels, Chebyshev) with random discs erased; no class vanishes."""
    base = scribble_label(mask, rng, p)
    alpha = p.elastic_alpha * min(mask.shape)
    sigma = p.elastic_sigma * min(mask.shape)
    grid = np.indices(mask.shape, dtype=np.float64)
    for axis in range(2):
        field = ndimage.gaussian_filter(rng.standard_normal(mask.shape), sigma)
        grid[axis] += field * (alpha / max(np.abs(field).max(), 1e-12))
    warped = ndimage.map_coordinates(base, grid, order=0, mode="constant", cval=IGNORE_INDEX)
    warped = _restore_vanished(base, warped)
    erase_r = p.pixels(p.erase_radius, mask.shape)
    for _ in range(rng.integers(p.erase_count[0], p.erase_count[1] + 1)):
        ys, xs = np.nonzero(warped != IGNORE_INDEX)
        if len(ys) == 0:
            break
        i = rng.integers(len(ys))
        yy, xx = np.ogrid[: mask.shape[0], : mask.shape[1]]
        trial = warped.copy()
        trial[(yy - ys[i]) ** 2 + (xx - xs[i]) ** 2 <= erase_r**2] = IGNORE_INDEX
        if set(np.unique(trial)) == set(np.unique(warped)):
            warped = trial
    return warped


def block_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Blocks: each class region eroded, leaving an unlabeled band of ``block_band`` (at most
    half the component's maximal depth) on each side of every boundary."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    band = p.pixels(p.block_band, mask.shape)
    for c in _present(mask, foreground=False):
        region = mask == c
        if region.all():
            out[:] = c
            continue
        dist = ndimage.distance_transform_edt(region)
        comps, n = ndimage.label(region)
        deepest = np.asarray(ndimage.maximum(dist, comps, np.arange(1, n + 1)), np.float64)
        threshold = np.minimum(band, 0.5 * deepest)
        inside = region & (dist > np.concatenate([[np.inf], threshold])[comps])
        out[inside] = c
    return out


def max_inscribed_rect(region: np.ndarray) -> tuple[int, int, int, int]:
    """Largest axis-aligned rectangle ``(r0, c0, r1, c1)`` (inclusive) inside ``region``.

    Large regions are searched on a grid of cells that lie wholly inside the region, so the
    result always lies inside; a region too thin for that grid gets its deepest pixel.
    """
    f = max(1, math.ceil(max(region.shape) / _COARSE))
    h, w = -(-region.shape[0] // f), -(-region.shape[1] // f)
    padded = np.zeros((h * f, w * f), bool)
    padded[: region.shape[0], : region.shape[1]] = region
    cells = padded.reshape(h, f, w, f).all(axis=(1, 3))
    if not cells.any():
        y, x = np.unravel_index(np.argmax(ndimage.distance_transform_edt(region)), region.shape)
        return int(y), int(x), int(y), int(x)
    r0, c0, r1, c1 = _largest_rectangle(cells)
    return r0 * f, c0 * f, (r1 + 1) * f - 1, (c1 + 1) * f - 1


def _largest_rectangle(grid: np.ndarray) -> tuple[int, int, int, int]:
    """Maximal all-true rectangle of a small boolean grid (histogram-stack method)."""
    heights = np.zeros(grid.shape[1] + 1, np.int64)
    best, best_rect = 0, (0, 0, 0, 0)
    for i, row in enumerate(grid):
        heights[:-1] = np.where(row, heights[:-1] + 1, 0)
        stack: list[tuple[int, int]] = []
        for j, hj in enumerate(heights.tolist()):
            start = j
            while stack and stack[-1][1] >= hj:
                s, sh = stack.pop()
                if sh * (j - s) > best:
                    best, best_rect = sh * (j - s), (i - sh + 1, s, i, j - 1)
                start = s
            stack.append((start, hj))
    return best_rect


def _present(mask: np.ndarray, *, foreground: bool) -> list[int]:
    return [int(c) for c in np.unique(mask) if c > 0 or not foreground]


def _relative_depth(region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance to the region's boundary (image border included) over each component's max."""
    dist = ndimage.distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]
    comps, n = ndimage.label(region)
    deepest = np.asarray(ndimage.maximum(dist, comps, np.arange(1, n + 1)), np.float64)
    return dist / np.concatenate([[1.0], deepest])[comps], comps


def _has_hole(comps: np.ndarray) -> np.ndarray:
    """Per component (1..n): whether it encloses a hole."""
    filled = ndimage.binary_fill_holes(comps > 0)
    n = int(comps.max())
    holes, _ = ndimage.label(filled & (comps == 0))
    holed = np.zeros(n, bool)
    for window_label in range(1, int(holes.max()) + 1):
        ring = ndimage.binary_dilation(holes == window_label) & (comps > 0)
        holed[np.unique(comps[ring]) - 1] = True
    return holed


def _paint(out: np.ndarray, curve: np.ndarray, region: np.ndarray, c: int, radius: int) -> None:
    """Draw ``curve`` with a round brush, clipped to ``region`` and to unlabeled pixels."""
    if curve.any():
        stroke = ndimage.binary_dilation(curve, disk(radius)) & region
        out[stroke & (out == IGNORE_INDEX)] = c


def _label_unlabeled_components(
    out: np.ndarray, comps: np.ndarray, depth: np.ndarray, c: int, radius: int
) -> None:
    """Give every component of class ``c`` left without labels a brush dot at its deepest pixel."""
    n = int(comps.max())
    labeled = ndimage.maximum(out == c, comps, np.arange(1, n + 1))
    for k in np.flatnonzero(~np.asarray(labeled, bool)) + 1:
        y, x = ndimage.maximum_position(depth, comps, k)
        dot = np.zeros(out.shape, bool)
        dot[y, x] = True
        _paint(out, dot, comps == k, c, radius)


def _stamp(
    out: np.ndarray,
    region: np.ndarray,
    centre: tuple[int, int],
    c: int,
    radius: int,
    rng: np.random.Generator,
) -> None:
    """A Gaussian-shaped brush dot (ragged by multiplicative noise) clipped to ``region``."""
    y, x = min(max(centre[0], 0), out.shape[0] - 1), min(max(centre[1], 0), out.shape[1] - 1)
    sigma = radius + 0.5
    reach = math.ceil(2 * sigma)
    y0, y1 = max(y - reach, 0), min(y + reach + 1, out.shape[0])
    x0, x1 = max(x - reach, 0), min(x + reach + 1, out.shape[1])
    yy, xx = np.ogrid[y0:y1, x0:x1]
    weight = np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * sigma**2))
    dot = weight * rng.uniform(0.75, 1.25, weight.shape) > 0.5
    dot[y - y0, x - x0] = True
    dot &= region[y0:y1, x0:x1]
    view = out[y0:y1, x0:x1]
    view[dot & (view == IGNORE_INDEX)] = c


def _background_points(
    out: np.ndarray, mask: np.ndarray, radius: int, rng: np.random.Generator, p: WeakLabelParams
) -> None:
    bg = mask == 0
    ys, xs = np.nonzero(~bg)
    if len(ys):
        margin = p.point_bg_margin * max(np.ptp(ys), np.ptp(xs)) + 2 * radius + 1
        cy, cx = (ys.min() + ys.max()) // 2, (xs.min() + xs.max()) // 2
        for y, x in (
            (ys.min() - margin, cx),
            (ys.max() + margin, cx),
            (cy, xs.min() - margin),
            (cy, xs.max() + margin),
        ):
            _stamp(out, bg, (round(y), round(x)), 0, radius, rng)
    if not (out == 0).any():
        comps, _ = ndimage.label(bg)
        largest = comps == 1 + np.argmax(np.bincount(comps.ravel())[1:])
        r0, c0, r1, c1 = max_inscribed_rect(largest)
        cy, cx = (r0 + r1) // 2, (c0 + c1) // 2
        for y, x in ((cy, c0), (cy, c1), (r0, cx), (r1, cx)):
            _stamp(out, bg, (y, x), 0, radius, rng)


def _restore_vanished(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Put back, unwarped, any class that the warp pushed out of the image entirely."""
    out = after.copy()
    for c in set(np.unique(before).tolist()) - set(np.unique(after).tolist()):
        out[(before == c) & (out == IGNORE_INDEX)] = c
    return out
