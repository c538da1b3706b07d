"""Weak-supervision regularisers on the CPU: the tree-energy loss and the gated CRF loss.

Both act on 2D predictions ``[B, C, H, W]`` and need no CUDA extension.

* :class:`TreeEnergyLoss` (Liang et al., "Tree Energy Loss", CVPR 2022) filters the softmax
  prediction along minimum spanning trees of the image (low level) and, optionally, of
  network embeddings (high level, applied one after the other as in FedICRA), and pulls the
  prediction of unlabeled pixels towards the filtered map with an L1 term.
* :class:`GatedCRFLoss` (Obukhov et al., "Gated CRF Loss", 2019) penalises label disagreement
  between neighbours within a window, weighted by an RGB-XY Gaussian kernel.

The tree filter is exact: ``out_i = sum_j S_ij x_j / sum_j S_ij`` with ``S_ij`` the product of
edge affinities along the tree path between pixels ``i`` and ``j``. It is evaluated as two
sparse triangular solves in breadth-first order (leaves to root, then root to leaves), with an
analytic backward pass for the input and for the affinities of high-level trees.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from scipy.sparse.csgraph import breadth_first_order, minimum_spanning_tree
from scipy.sparse.linalg import spsolve_triangular
from torch import nn

__all__ = ["GatedCRFLoss", "TreeEnergyLoss", "minmax_per_sample", "spanning_forest", "tree_filter"]


def _check_4d(name: str, t: torch.Tensor) -> None:
    if t.ndim != 4:
        raise ValueError(f"{name} must be [B, C, H, W], got shape {tuple(t.shape)}")


def minmax_per_sample(images: torch.Tensor) -> torch.Tensor:
    """Rescale every sample of ``[B, C, *S]`` to [0, 1] (all channels jointly).

    The affinity bandwidths of both losses (tree ``sigma`` 0.02, CRF ``rgb`` 0.1) assume
    images in [0, 1]; a constant image maps to zeros.
    """
    flat = images.detach().flatten(1)
    lo, hi = flat.min(1).values, flat.max(1).values
    shape = (-1,) + (1,) * (images.ndim - 1)
    return (images - lo.view(shape)) / (hi - lo).clamp(min=1e-12).view(shape)


# -- minimum spanning trees -------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _grid_edges(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Endpoints of the 4-connected grid's edges: vertical pairs, then horizontal pairs."""
    idx = np.arange(h * w).reshape(h, w)
    a = np.concatenate([idx[:-1].ravel(), idx[:, :-1].ravel()])
    b = np.concatenate([idx[1:].ravel(), idx[:, 1:].ravel()])
    return a, b


@dataclass(frozen=True)
class Forest:
    """Spanning trees of ``B`` images joined under one virtual root, in breadth-first order.

    Position 0 is the virtual root; position ``i >= 1`` holds pixel ``child[i - 1]`` (a flat
    index over ``B * H * W``) whose parent pixel is ``parent[i - 1]`` at position
    ``parent_pos[i - 1]``. ``is_root`` marks each image's own root (pixel 0), attached to the
    virtual root by an edge of affinity 0, so images never exchange information.
    """

    child: np.ndarray
    parent: np.ndarray
    parent_pos: np.ndarray
    is_root: np.ndarray
    position: np.ndarray
    """Position of every pixel: ``position[child[k]] = k + 1``."""


def spanning_forest(guide: torch.Tensor) -> Forest:
    """Minimum spanning trees of the 4-connected pixel grids of ``guide`` ``[B, C, H, W]``.

    Edge cost is the squared feature distance plus 1 (scipy drops explicit zeros, and a
    constant shift changes no minimum spanning tree). No gradient flows through the tree.
    """
    _check_4d("guide", guide)
    b, _, h, w = guide.shape
    n = h * w
    a, c = _grid_edges(h, w)
    g = guide.detach().to(torch.float64).reshape(b, -1, n).cpu().numpy()
    cost = ((g[:, :, a] - g[:, :, c]) ** 2).sum(1) + 1.0
    offs = (np.arange(b) * n)[:, None]
    top = b * n
    rows = np.concatenate([(a[None] + offs).ravel(), offs[:, 0]])
    cols = np.concatenate([(c[None] + offs).ravel(), np.full(b, top)])
    data = np.concatenate([cost.ravel(), np.ones(b)])
    graph = sp.coo_matrix((data, (rows, cols)), shape=(top + 1, top + 1)).tocsr()
    tree = minimum_spanning_tree(graph)
    order, pred = breadth_first_order(tree, top, directed=False, return_predecessors=True)
    if len(order) != top + 1:  # pragma: no cover - the grid graph is always connected
        raise RuntimeError(f"spanning forest covers {len(order)} of {top + 1} vertices")
    child = order[1:]
    parent = pred[child]
    position = np.empty(top + 1, dtype=np.int64)
    position[order] = np.arange(top + 1)
    return Forest(child, parent, position[parent], parent == top, position[:top])


# -- the tree filter --------------------------------------------------------------------------


def _systems(forest: Forest, w: np.ndarray) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """``A = I - W_up`` (upper triangular in BFS order) and ``A^T`` as CSR matrices."""
    m = len(w)
    diag = np.arange(m)
    rows = np.concatenate([diag, forest.parent_pos])
    cols = np.concatenate([diag, diag[1:]])
    vals = np.concatenate([np.ones(m), -w[1:]])
    up = sp.csr_matrix((vals, (rows, cols)), shape=(m, m))
    low = sp.csr_matrix((vals, (cols, rows)), shape=(m, m))
    return up, low


class _TreePasses(torch.autograd.Function):
    """``R = A^-T D A^-1 X`` in BFS position space (``D = diag(1 - w^2)``), with gradients.

    ``X``: ``[M, K]`` (row 0 is the virtual root), ``w``: ``[M]`` affinity of each node to its
    parent (0 for the virtual root and the image roots).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, forest: Forest) -> torch.Tensor:
        wn = w.detach().to(torch.float64).cpu().numpy()
        up, low = _systems(forest, wn)
        xn = x.detach().to(torch.float64).cpu().numpy()
        d = (1.0 - wn**2)[:, None]
        u = spsolve_triangular(up, xn, lower=False, unit_diagonal=True)
        r = spsolve_triangular(low, d * u, lower=True, unit_diagonal=True)
        ctx.forest, ctx.systems, ctx.arrays = forest, (up, low), (wn, u, r)
        return torch.as_tensor(r, dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        up, low = ctx.systems
        wn, u, r = ctx.arrays
        g = grad.detach().to(torch.float64).cpu().numpy()
        gamma = spsolve_triangular(up, g, lower=False, unit_diagonal=True)
        rho = spsolve_triangular(
            low, (1.0 - wn**2)[:, None] * gamma, lower=True, unit_diagonal=True
        )
        grad_x = torch.as_tensor(rho, dtype=grad.dtype, device=grad.device)
        grad_w = None
        if ctx.needs_input_grad[1]:
            pp = ctx.forest.parent_pos
            gw = np.zeros_like(wn)
            gw[1:] = (
                gamma[1:] * r[pp] + rho[pp] * u[1:] - 2.0 * wn[1:, None] * gamma[1:] * u[1:]
            ).sum(1)
            grad_w = torch.as_tensor(gw, dtype=grad.dtype, device=grad.device)
        return grad_x, grad_w, None


def tree_filter(
    x: torch.Tensor,
    guide: torch.Tensor,
    sigma: float | None = None,
    forest: Forest | None = None,
) -> torch.Tensor:
    """Normalised tree filter of ``x`` ``[B, K, H, W]`` along the MST of ``guide``.

    Affinity of a tree edge ``(v, parent)``: ``exp(-||g_v - g_p||^2 / sigma)`` (low level,
    e.g. the image with ``sigma`` 0.02) or ``exp(-||g_v - g_p||^2)`` when ``sigma`` is
    ``None`` (high level, an embedding; gradients reach ``guide`` through the affinities).
    """
    _check_4d("x", x)
    _check_4d("guide", guide)
    if x.shape[0] != guide.shape[0] or x.shape[2:] != guide.shape[2:]:
        raise ValueError(
            f"tree_filter: x {tuple(x.shape)} and guide {tuple(guide.shape)} need the same "
            "batch size and spatial shape"
        )
    b, k, h, w = x.shape
    forest = forest or spanning_forest(guide)
    child = torch.as_tensor(forest.child, device=x.device)
    parent = torch.as_tensor(np.where(forest.is_root, forest.child, forest.parent), device=x.device)
    g = guide.permute(1, 0, 2, 3).reshape(guide.shape[1], -1)
    dist = (g[:, child] - g[:, parent]).pow(2).sum(0)
    aff = torch.exp(-dist / sigma) if sigma is not None else torch.exp(-dist)
    aff = aff.masked_fill(torch.as_tensor(forest.is_root, device=x.device), 0.0)
    w_pos = torch.cat([aff.new_zeros(1), aff])
    ones = torch.ones_like(x[:, :1])
    flat = torch.cat([x, ones], 1).permute(0, 2, 3, 1).reshape(b * h * w, k + 1)
    x_pos = torch.cat([flat.new_zeros(1, k + 1), flat[child]])
    r = _TreePasses.apply(x_pos, w_pos, forest)
    r = r[torch.as_tensor(forest.position, device=x.device)].reshape(b, h, w, k + 1)
    r = r.permute(0, 3, 1, 2)
    return r[:, :k] / r[:, k:]


class TreeEnergyLoss(nn.Module):
    """Tree energy loss on unlabeled pixels, single- or multi-level ("recursive").

    ``P = softmax(logits)``; ``A = TF_low(P; image)``, then ``A = TF_high(A; e)`` for every
    embedding ``e`` in ``high_feats`` in turn (each resized bilinearly to the logits' size);
    loss ``= sum over unlabeled pixels and classes of |P - A| / (number of unlabeled pixels)``.
    ``A`` is not detached (as in the reference implementation): gradients reach ``P`` through
    both terms and the embeddings through the high-level affinities.

    Parameters
    ----------
    sigma
        Bandwidth of the low-level (image) affinities (0.02 in TEL on VOC and in FedICRA).
    """

    def __init__(self, sigma: float = 0.02) -> None:
        super().__init__()
        if sigma <= 0:
            raise ValueError(f"TreeEnergyLoss: sigma must be > 0, got {sigma}")
        self.sigma = sigma

    def forward(
        self,
        logits: torch.Tensor,
        image: torch.Tensor,
        unlabeled: torch.Tensor,
        high_feats: Sequence[torch.Tensor] = (),
    ) -> torch.Tensor:
        """Loss of ``logits`` ``[B, C, H, W]`` given the guidance image ``[B, Ci, h, w]`` and
        the unlabeled mask ``[B, H, W]`` (bool or 0/1)."""
        _check_4d("logits", logits)
        size = logits.shape[2:]
        if unlabeled.shape != (logits.shape[0], *size):
            raise ValueError(
                f"TreeEnergyLoss: unlabeled must be {(logits.shape[0], *size)}, "
                f"got {tuple(unlabeled.shape)}"
            )
        with torch.no_grad():
            low = F.interpolate(image.float(), size=size, mode="bilinear", align_corners=False)
        prob = torch.softmax(logits, 1)
        filtered = tree_filter(prob, low, self.sigma)
        for feat in high_feats:
            up = F.interpolate(feat, size=size, mode="bilinear", align_corners=False)
            filtered = tree_filter(filtered, up, None)
        mask = unlabeled.to(prob.dtype).unsqueeze(1)
        return (mask * (prob - filtered).abs()).sum() / mask.sum().clamp(min=1.0)


# -- gated CRF ----------------------------------------------------------------------------------


def _pair_views(t: torch.Tensor, dy: int, dx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(t[p], t[p + (dy, dx)])`` over every pixel ``p`` whose neighbour is inside."""
    h, w = t.shape[-2:]
    c0, c1 = max(0, -dx), w - max(0, dx)
    return t[..., : h - dy, c0:c1], t[..., dy:, c0 + dx : c1 + dx]


class GatedCRFLoss(nn.Module):
    """Gated CRF loss with one RGB-XY kernel and the Potts compatibility.

    ``L = 1/denom sum_i sum_{j in win(i), j != i} K_ij m_src(j) m_dst(i) (1 - sum_c y_i^c y_j^c)``
    with ``K_ij = weight * exp(-|p_i - p_j|^2 / (2 xy^2) - ||I_i - I_j||^2 / (2 rgb^2))`` over a
    ``(2 radius + 1)^2`` window. ``denom`` is ``B*H*W``, or the sum of the destination (else
    source) mask. Only pairs inside the image count: the reference unfold implementation also
    adds a prediction-independent constant for zero-padded neighbours, which changes no
    gradient. Evaluated offset by offset (half the window, by symmetry) in O(B*C*H*W) memory.

    Parameters
    ----------
    radius
        Window radius in pixels of the prediction (5 in FedICRA/FedLPPA).
    sigma_xy, sigma_rgb
        Bandwidths of the position and intensity terms (6 and 0.1).
    weight
        Kernel weight (1).
    """

    def __init__(
        self, radius: int = 5, sigma_xy: float = 6.0, sigma_rgb: float = 0.1, weight: float = 1.0
    ) -> None:
        super().__init__()
        if radius < 1 or sigma_xy <= 0 or sigma_rgb <= 0:
            raise ValueError(
                "GatedCRFLoss: radius must be >= 1 and sigmas > 0, got "
                f"radius={radius}, sigma_xy={sigma_xy}, sigma_rgb={sigma_rgb}"
            )
        self.radius, self.sigma_xy, self.sigma_rgb, self.weight = (
            radius,
            sigma_xy,
            sigma_rgb,
            weight,
        )

    def forward(
        self,
        probs: torch.Tensor,
        image: torch.Tensor,
        mask_src: torch.Tensor | None = None,
        mask_dst: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Loss of class probabilities ``[B, C, H, W]`` given the image ``[B, Ci, H', W']``
        (area-downsampled to ``H x W`` if larger) and optional 0/1 masks ``[B, H, W]``."""
        _check_4d("probs", probs)
        _check_4d("image", image)
        b, _, h, w = probs.shape
        if image.shape[0] != b:
            raise ValueError(f"GatedCRFLoss: image batch {image.shape[0]} != probs batch {b}")
        img = image.to(probs.dtype)
        if img.shape[2:] != probs.shape[2:]:
            img = F.adaptive_avg_pool2d(img, (h, w))
        img = img / self.sigma_rgb
        src = None if mask_src is None else mask_src.to(probs.dtype).unsqueeze(1)
        dst = None if mask_dst is None else mask_dst.to(probs.dtype).unsqueeze(1)
        denom = float(b * h * w)
        for m in (src, dst):
            if m is not None:
                denom = m.sum().clamp(min=1.0)
        total = probs.new_zeros(())
        r = self.radius
        for dy in range(r + 1):
            for dx in range(-r, r + 1):
                if dy == 0 and dx <= 0:
                    continue
                pa, pb = _pair_views(probs, dy, dx)
                ia, ib = _pair_views(img, dy, dx)
                xy = -0.5 * (dy * dy + dx * dx) / self.sigma_xy**2
                kern = torch.exp(xy - 0.5 * (ia - ib).pow(2).sum(1, keepdim=True))
                disagree = 1.0 - (pa * pb).sum(1, keepdim=True)
                gate = self._gate(src, dst, dy, dx)
                total = total + (kern * disagree * gate).sum()
        return self.weight * total / denom

    @staticmethod
    def _gate(
        src: torch.Tensor | None, dst: torch.Tensor | None, dy: int, dx: int
    ) -> torch.Tensor | float:
        """Both directions of each unordered pair: m_src(j) m_dst(i) + m_src(i) m_dst(j)."""
        if src is None and dst is None:
            return 2.0
        sa, sb = _pair_views(src, dy, dx) if src is not None else (1.0, 1.0)
        da, db = _pair_views(dst, dy, dx) if dst is not None else (1.0, 1.0)
        return sb * da + sa * db
