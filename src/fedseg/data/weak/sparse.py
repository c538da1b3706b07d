"""Point, scribble, scribble2 and block labels synthesized from a full 2D mask (paper Sec. IV-A).

Every function maps a mask (H, W) of class indices to a label of the same shape holding class
indices on labeled pixels and ``IGNORE_INDEX`` elsewhere. Background is a class like any other:
every *meaningful* connected region of every class present (``meaningful_regions``), wherever
it lies, gets labeled pixels; point, scribble and block pixels always lie inside their own
region, and scribble2 keeps at least one correct pixel in each of them. The rules and their
sources are in docs/weak_labels.md.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage
from skimage.morphology import disk, skeletonize

from fedseg.data.manifest import IGNORE_INDEX
from fedseg.data.weak.params import WeakLabelParams

__all__ = [
    "block_label",
    "max_inscribed_rect",
    "meaningful_regions",
    "point_label",
    "scribble2_label",
    "scribble_label",
]

_COARSE = 64
"""The inscribed-rectangle search runs on a grid of at most this many cells per side."""
_NEIGHBOURS = np.ones((3, 3), np.uint8)


def meaningful_regions(mask: np.ndarray, c: int, min_pixels: int) -> list[np.ndarray]:
    """Connected regions (8-connected) of class ``c`` an annotator labels: those of at least
    ``min_pixels`` pixels, largest first, or the largest one alone if none is that large."""
    comps, n = ndimage.label(mask == c, structure=_NEIGHBOURS)
    if n == 0:
        return []
    sizes = np.bincount(comps.ravel())[1:]
    order = np.argsort(-sizes, kind="stable")
    keep = [int(k) + 1 for k in order if sizes[k] >= min_pixels] or [int(order[0]) + 1]
    return [comps == k for k in keep]


def point_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Points: in every meaningful region of every class, the midpoints of the four sides of
    the region's maximal inscribed rectangle shrunk by a random ratio, stamped with a
    Gaussian-shaped brush. Background regions are searched near the structures first (inside
    the grown foreground bounding box)."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    radius = p.pixels(p.brush, mask.shape)
    min_px = p.min_region_pixels(mask.shape)
    near = _near_structures(mask, p)
    for c in _present(mask):
        for region in meaningful_regions(mask, c, min_px):
            search = region
            if c == 0 and (region & near).sum() >= min_px:
                search = region & near
            (window,) = ndimage.find_objects(search.astype(np.int8))
            r0, c0, r1, c1 = max_inscribed_rect(search[window])
            ratio = rng.uniform(*p.point_shrink)
            cy = window[0].start + (r0 + r1) / 2
            cx = window[1].start + (c0 + c1) / 2
            hy, hx = (r1 - r0) / 2 * ratio, (c1 - c0) / 2 * ratio
            for dy, dx in ((-hy, 0), (hy, 0), (0, -hx), (0, hx)):
                _stamp(out, region, (round(cy + dy), round(cx + dx)), c, radius, rng)
    return out


def scribble_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Scribbles: every meaningful region of every class eroded by ``scribble_margin`` (at
    most half its depth), skeletonised and pruned of spurs shorter than ``scribble_prune``,
    drawn with a round brush clipped to the region. A compact region, whose skeleton is
    shorter than half the square root of its area, also gets the chord along its principal
    axis through its deepest pixel. So a blob gets a stroke along its long axis, a ring (rim,
    background around an object) a loop, tissue between structures a stroke along its
    middle."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    radius = p.pixels(p.brush, mask.shape)
    margin = p.pixels(p.scribble_margin, mask.shape)
    prune = p.pixels(p.scribble_prune, mask.shape)
    min_px = p.min_region_pixels(mask.shape)
    for c in _present(mask):
        for region in meaningful_regions(mask, c, min_px):
            depth = _depth(region)
            inside = depth > min(margin, 0.5 * depth.max())
            curve = _prune(skeletonize(inside), prune)
            if curve.sum() < 0.5 * math.sqrt(region.sum()):  # compact: point-like skeleton
                curve |= _chord(inside, depth)
            _paint(out, curve, region, c, radius)
    return out


def scribble2_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Scribbles of another style: ``scribble_label`` warped by a smooth random elastic field
    (at most ``elastic_alpha`` per axis, so labels may leave their region by at most
    ``ceil(alpha_px + 0.5)`` pixels, Chebyshev) with random discs erased. A meaningful region
    left without a correct label by the warp gets its unwarped scribble back, and an erasure
    that would empty one is skipped."""
    base = scribble_label(mask, rng, p)
    alpha = p.elastic_alpha * min(mask.shape)
    sigma = p.elastic_sigma * min(mask.shape)
    grid = np.indices(mask.shape, dtype=np.float64)
    for axis in range(2):
        field = ndimage.gaussian_filter(rng.standard_normal(mask.shape), sigma)
        grid[axis] += field * (alpha / max(np.abs(field).max(), 1e-12))
    warped = ndimage.map_coordinates(base, grid, order=0, mode="constant", cval=IGNORE_INDEX)
    min_px = p.min_region_pixels(mask.shape)
    regions = [(c, r) for c in _present(mask) for r in meaningful_regions(mask, c, min_px)]
    for c, region in regions:
        if not (warped[region] == c).any():
            warped[region & (base == c)] = c
    erase_r = p.pixels(p.erase_radius, mask.shape)
    yy, xx = np.ogrid[: mask.shape[0], : mask.shape[1]]
    for _ in range(rng.integers(p.erase_count[0], p.erase_count[1] + 1)):
        ys, xs = np.nonzero(warped != IGNORE_INDEX)
        if len(ys) == 0:
            break
        i = rng.integers(len(ys))
        trial = warped.copy()
        trial[(yy - ys[i]) ** 2 + (xx - xs[i]) ** 2 <= erase_r**2] = IGNORE_INDEX
        if all((trial[region] == c).any() for c, region in regions):
            warped = trial
    return warped


def block_label(mask: np.ndarray, rng: np.random.Generator, p: WeakLabelParams) -> np.ndarray:
    """Blocks: each class region eroded, leaving an unlabeled band of ``block_band`` (at most
    half the component's maximal depth) on each side of every boundary."""
    out = np.full(mask.shape, IGNORE_INDEX, np.uint8)
    band = p.pixels(p.block_band, mask.shape)
    for c in _present(mask):
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


def _present(mask: np.ndarray) -> list[int]:
    return [int(c) for c in np.unique(mask)]


def _depth(region: np.ndarray) -> np.ndarray:
    """Distance to the region's boundary; the image border is not a boundary unless the
    region fills the whole image."""
    if region.all():
        return ndimage.distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]
    return ndimage.distance_transform_edt(region)


def _prune(skeleton: np.ndarray, n: int) -> np.ndarray:
    """Remove end pixels ``n`` times (spurs shorter than ``n`` vanish, stroke ends recede by
    ``n``); loops are kept, and the last non-empty skeleton is returned."""
    cur = skeleton
    for _ in range(n):
        neighbours = ndimage.convolve(cur.astype(np.uint8), _NEIGHBOURS, mode="constant") - cur
        nxt = cur & (neighbours > 1)
        if not nxt.any() or np.array_equal(nxt, cur):
            break
        cur = nxt
    return cur


def _chord(inside: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """The straight run through the deepest pixel along the principal axis of ``inside``,
    up to where it leaves ``inside``."""
    y0, x0 = np.unravel_index(np.argmax(depth), depth.shape)
    ys, xs = np.nonzero(inside)
    cov = np.cov(np.stack([ys, xs]).astype(np.float64)) if len(ys) > 2 else np.eye(2)
    dy, dx = np.linalg.eigh(cov)[1][:, -1]
    out = np.zeros(inside.shape, bool)
    out[y0, x0] = True
    for sign in (1, -1):
        for t in range(1, sum(inside.shape)):
            y, x = round(y0 + sign * t * dy), round(x0 + sign * t * dx)
            if not (0 <= y < inside.shape[0] and 0 <= x < inside.shape[1] and inside[y, x]):
                break
            out[y, x] = True
    return out


def _near_structures(mask: np.ndarray, p: WeakLabelParams) -> np.ndarray:
    """The foreground's bounding box grown by ``point_bg_margin`` of its size (all of the
    image when there is no foreground)."""
    ys, xs = np.nonzero(mask > 0)
    near = np.zeros(mask.shape, bool)
    if len(ys) == 0:
        near[:] = True
        return near
    grow = math.ceil(p.point_bg_margin * max(np.ptp(ys), np.ptp(xs)) + 1)
    near[
        max(ys.min() - grow, 0) : ys.max() + grow + 1, max(xs.min() - grow, 0) : xs.max() + grow + 1
    ] = True
    return near


def _paint(out: np.ndarray, curve: np.ndarray, region: np.ndarray, c: int, radius: int) -> None:
    """Draw ``curve`` with a round brush, clipped to ``region`` and to unlabeled pixels."""
    if curve.any():
        stroke = ndimage.binary_dilation(curve, disk(radius)) & region
        out[stroke & (out == IGNORE_INDEX)] = c


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
