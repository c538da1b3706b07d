"""Tree-energy and gated-CRF losses: brute-force references and hand-made tiny cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from fedseg.losses_weak import (
    GatedCRFLoss,
    TreeEnergyLoss,
    minmax_per_sample,
    spanning_forest,
    tree_filter,
)


def _two_regions(b: int = 1, h: int = 6, w: int = 8) -> torch.Tensor:
    """Images [b, 1, h, w]: left half 0.1, right half 0.9."""
    img = torch.full((b, 1, h, w), 0.1, dtype=torch.float64)
    img[..., w // 2 :] = 0.9
    return img


def _brute_tree_filter(
    x: np.ndarray, guide: np.ndarray, sigma: float, forest, b: int
) -> np.ndarray:
    """out_i = sum_j S_ij x_j / sum_j S_ij with S_ij the product of affinities on the path."""
    k, h, w = x.shape
    n = h * w
    parent = {
        int(c) % n: (None if r else int(p) % n)
        for c, p, r in zip(forest.child, forest.parent, forest.is_root, strict=True)
        if int(c) // n == b
    }
    g = guide.reshape(guide.shape[0], n)

    def up(v: int) -> list[int]:
        path = [v]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        return path

    def aff(v: int) -> float:
        return math.exp(-float(((g[:, v] - g[:, parent[v]]) ** 2).sum()) / sigma)

    s = np.zeros((n, n))
    for i, j in itertools.product(range(n), range(n)):
        pi, pj = up(i), up(j)
        meet = next(v for v in pi if v in pj)
        s[i, j] = math.prod(aff(v) for v in pi[: pi.index(meet)]) * math.prod(
            aff(v) for v in pj[: pj.index(meet)]
        )
    flat = x.reshape(k, n)
    return ((s @ flat.T) / s.sum(1, keepdims=True)).T.reshape(k, h, w)


def test_spanning_forest_is_a_tree_per_image():
    guide = torch.rand(3, 2, 5, 7)
    f = spanning_forest(guide)
    n = 35
    assert len(f.child) == 3 * n and sorted(f.child) == list(range(3 * n))
    assert f.is_root.sum() == 3 and set(f.child[f.is_root]) == {0, n, 2 * n}
    inner = ~f.is_root
    assert (f.child[inner] // n == f.parent[inner] // n).all()  # no edge between images
    assert (f.parent_pos < np.arange(1, 3 * n + 1)).all()  # parents come first (BFS order)


def test_tree_filter_matches_brute_force_path_products():
    torch.manual_seed(0)
    x = torch.rand(2, 3, 4, 5, dtype=torch.float64)
    guide = torch.rand(2, 2, 4, 5, dtype=torch.float64)
    forest = spanning_forest(guide)
    out = tree_filter(x, guide, 0.5, forest)
    for b in range(2):
        ref = _brute_tree_filter(x[b].numpy(), guide[b].numpy(), 0.5, forest, b)
        np.testing.assert_allclose(out[b].numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("sigma", [None, 0.3])
def test_tree_filter_gradients_match_finite_differences(sigma):
    torch.manual_seed(1)
    x = torch.rand(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    guide = torch.rand(2, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    forest = spanning_forest(guide)
    assert torch.autograd.gradcheck(lambda a, e: tree_filter(a, e, sigma, forest), (x, guide))


def test_tree_filter_keeps_constants_and_separates_images():
    torch.manual_seed(2)
    guide = torch.rand(2, 1, 6, 6)
    const = torch.full((2, 2, 6, 6), 0.25)
    torch.testing.assert_close(tree_filter(const, guide, 0.02), const)
    x = torch.rand(2, 2, 6, 6)
    other = x.clone()
    other[1] = torch.rand(2, 6, 6)
    torch.testing.assert_close(tree_filter(x, guide, 0.02)[0], tree_filter(other, guide, 0.02)[0])


def test_tree_energy_is_zero_for_a_prediction_following_the_image_and_high_otherwise():
    img = _two_regions().float()
    unlabeled = torch.ones(1, 6, 8, dtype=torch.bool)
    follows = torch.zeros(1, 2, 6, 8)
    follows[:, 1, :, 4:] = 6.0  # foreground exactly on the bright half
    crosses = torch.zeros(1, 2, 6, 8)
    crosses[:, 1, :3] = 6.0  # boundary through the middle of both flat halves
    loss = TreeEnergyLoss(sigma=0.02)
    assert float(loss(follows, img, unlabeled)) < 1e-6
    assert float(loss(crosses, img, unlabeled)) > 0.1


def test_tree_energy_counts_only_unlabeled_pixels_and_passes_gradients():
    torch.manual_seed(3)
    logits = torch.randn(2, 2, 8, 8, requires_grad=True)
    feats = [torch.randn(2, 2, s, s, requires_grad=True) for s in (2, 4, 8)]
    img = torch.rand(2, 1, 8, 8)
    loss = TreeEnergyLoss()
    none = torch.zeros(2, 8, 8, dtype=torch.bool)
    assert loss(logits, img, none, feats).item() == 0.0
    value = loss(logits, img, torch.rand(2, 8, 8) > 0.3, feats)
    value.backward()
    assert torch.isfinite(value) and value > 0
    for t in (logits, *feats):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_tree_energy_rejects_mismatched_mask():
    with pytest.raises(ValueError, match="unlabeled must be"):
        TreeEnergyLoss()(torch.zeros(1, 2, 4, 4), torch.zeros(1, 1, 4, 4), torch.zeros(1, 3, 3))


def _brute_crf(probs, image, radius, sxy, srgb, src=None, dst=None) -> float:
    b, _, h, w = probs.shape
    total = 0.0
    for n, i, j in itertools.product(range(b), range(h), range(w)):
        for di, dj in itertools.product(range(-radius, radius + 1), repeat=2):
            p, q = i + di, j + dj
            if (di, dj) == (0, 0) or not (0 <= p < h and 0 <= q < w):
                continue
            feat = (di * di + dj * dj) / sxy**2 + float(
                ((image[n, :, i, j] - image[n, :, p, q]) ** 2).sum()
            ) / srgb**2
            gate = (1.0 if src is None else float(src[n, p, q])) * (
                1.0 if dst is None else float(dst[n, i, j])
            )
            agree = float((probs[n, :, i, j] * probs[n, :, p, q]).sum())
            total += math.exp(-0.5 * feat) * gate * (1 - agree)
    denom = b * h * w
    for m in (src, dst):
        if m is not None:
            denom = float(m.sum())
    return total / denom


@pytest.mark.parametrize("masked", [False, True])
def test_gated_crf_matches_brute_force(masked):
    torch.manual_seed(4)
    probs = torch.softmax(torch.randn(2, 3, 5, 6, dtype=torch.float64), 1)
    image = torch.rand(2, 2, 5, 6, dtype=torch.float64)
    src = (torch.rand(2, 5, 6) > 0.3).double() if masked else None
    dst = (torch.rand(2, 5, 6) > 0.3).double() if masked else None
    got = GatedCRFLoss(radius=2, sigma_xy=1.5, sigma_rgb=0.4)(probs, image, src, dst)
    assert float(got) == pytest.approx(_brute_crf(probs, image, 2, 1.5, 0.4, src, dst), rel=1e-10)


def test_gated_crf_zero_for_constant_labels_and_prefers_image_edges():
    img = _two_regions().float()
    crf = GatedCRFLoss()
    constant = torch.zeros(1, 2, 6, 8)
    constant[:, 0] = 1.0
    assert float(crf(constant, img)) == 0.0
    follows = torch.zeros(1, 2, 6, 8)
    follows[:, 0, :, :4], follows[:, 1, :, 4:] = 1.0, 1.0
    crosses = torch.zeros(1, 2, 6, 8)
    crosses[:, 0, :3], crosses[:, 1, 3:] = 1.0, 1.0
    assert float(crf(follows, img)) < 1e-3 * float(crf(crosses, img))
    probs = torch.softmax(torch.randn(1, 2, 6, 8, requires_grad=True), 1)
    probs.retain_grad()
    crf(probs, img).backward()
    assert torch.isfinite(probs.grad).all() and probs.grad.abs().sum() > 0


def test_minmax_per_sample():
    x = torch.stack([torch.linspace(-3, 5, 16).view(1, 4, 4), torch.full((1, 4, 4), 2.0)])
    y = minmax_per_sample(x)
    assert float(y[0].min()) == 0.0 and float(y[0].max()) == 1.0
    assert float(y[1].abs().max()) == 0.0
