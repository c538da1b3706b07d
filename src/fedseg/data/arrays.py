"""Array helpers shared by importers and synthetic tasks: intensity scaling, resizing, cropping."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["center_crop_or_pad", "normalize_intensity", "resize_image", "resize_mask"]


def normalize_intensity(image: np.ndarray, percentile: float = 99.5) -> np.ndarray:
    """Scale to [0, 1]: values above the upper ``percentile`` are clipped, the minimum maps to 0
    (the papers normalise every image/volume to [0, 1])."""
    lo, hi = float(image.min()), float(np.percentile(image, percentile))
    return np.clip((image - lo) / max(hi - lo, 1e-6), 0, 1).astype(np.float32)


def resize_image(image: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Resize a channel-first image (C, *spatial) to ``shape``: area averaging when shrinking,
    (bi/tri)linear interpolation when enlarging."""
    if tuple(image.shape[1:]) == tuple(shape):
        return image.astype(np.float32)
    x = torch.from_numpy(np.ascontiguousarray(image, np.float32))[None]
    shrink = all(s <= o for s, o in zip(shape, image.shape[1:], strict=True))
    mode = "area" if shrink else ("bilinear" if len(shape) == 2 else "trilinear")
    kwargs = {} if mode == "area" else {"align_corners": False}
    return F.interpolate(x, size=tuple(shape), mode=mode, **kwargs)[0].numpy()


def resize_mask(mask: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Resize a label map (*spatial) to ``shape`` by nearest neighbour (labels never blend)."""
    if tuple(mask.shape) == tuple(shape):
        return mask.astype(np.uint8)
    x = torch.from_numpy(np.ascontiguousarray(mask, np.float32))[None, None]
    return F.interpolate(x, size=tuple(shape), mode="nearest-exact")[0, 0].numpy().astype(np.uint8)


def center_crop_or_pad(array: np.ndarray, shape: Sequence[int], fill: float = 0) -> np.ndarray:
    """Centre-crop or pad (with ``fill``) the last ``len(shape)`` axes of ``array`` to ``shape``."""
    lead = array.ndim - len(shape)
    out = np.full(array.shape[:lead] + tuple(shape), fill, array.dtype)
    src, dst = [slice(None)] * lead, [slice(None)] * lead
    for have, want in zip(array.shape[lead:], shape, strict=True):
        start_src, start_dst = max(0, (have - want) // 2), max(0, (want - have) // 2)
        n = min(have, want)
        src.append(slice(start_src, start_src + n))
        dst.append(slice(start_dst, start_dst + n))
    out[tuple(dst)] = array[tuple(src)]
    return out
