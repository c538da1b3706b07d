"""FINCH clustering (Sarfraz et al., CVPR 2019) of prototype vectors, as FPL, FedPLVM and
FedBCS use it: cosine distance, no early-exit purity guard, the coarsest partition FINCH
keeps (``c[:, -1]``), unweighted cluster means. Backed by the ``finch-clust`` package.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedseg.errors import ConfigError

__all__ = ["finch_clusters"]


def _finch() -> Callable[..., Any]:
    with warnings.catch_warnings():
        # finch-clust warns at import that the optional pynndescent is missing; it is only
        # used above 70,000 points (we pass ann_threshold=70000), never for prototypes.
        warnings.filterwarnings("ignore", message=".*pynndescent.*")
        try:
            from finch import FINCH
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise ConfigError(f"FINCH needs the finch-clust package: {e}") from None
    return FINCH


def finch_clusters(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(labels [N] int64, centroids [M, D] float32)`` of ``vectors`` ``[N, D]``.

    One vector is its own cluster; otherwise labels come from FINCH's last partition and
    each centroid is the unweighted mean of its members (cluster order = label order).
    """
    if vectors.dim() != 2 or len(vectors) == 0:
        raise ValueError(f"finch_clusters needs [N > 0, D] vectors, got {list(vectors.shape)}")
    x = vectors.detach().float().cpu()
    if len(x) == 1:
        return torch.zeros(1, dtype=torch.long), x.clone()
    c, _, _ = _finch()(
        np.ascontiguousarray(x.numpy()),
        distance="cosine",
        ensure_early_exit=False,
        verbose=False,
        ann_threshold=70_000,
    )
    labels = torch.as_tensor(np.asarray(c)[:, -1], dtype=torch.long)
    _, labels = torch.unique(labels, return_inverse=True)
    centroids = torch.stack([x[labels == k].mean(0) for k in range(int(labels.max()) + 1)])
    return labels, centroids
