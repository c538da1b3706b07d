"""``augment``: labels follow images exactly, deterministic per generator, 2D and 3D."""

from __future__ import annotations

import pytest
import torch

from fedseg.data.transforms import augment


def batch(n: int, spatial: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose first channel encodes each pixel's label, so geometry can be compared."""
    labels = torch.randint(0, 250, (n, *spatial), generator=torch.Generator().manual_seed(0))
    images = torch.stack([labels.float(), torch.ones_like(labels, dtype=torch.float)], dim=1)
    return images, labels


@pytest.mark.parametrize("spatial", [(16, 16), (4, 16, 16), (12, 20)])
def test_labels_get_the_same_geometry_as_images(spatial: tuple[int, ...]) -> None:
    images, labels = batch(8, spatial)
    out_x, out_y = augment(images, labels, torch.Generator().manual_seed(3))
    assert out_x.shape == images.shape and out_y.shape == labels.shape
    assert out_y.dtype == labels.dtype
    # x' = a * x + b per sample, and channel 1 was all ones: x0' - x1' = a * (label' - 1)
    diff = (out_x[:, 0] - out_x[:, 1]).flatten(1)
    shifted = (out_y.float() - 1).flatten(1)
    a = (diff * shifted).sum(1) / (shifted * shifted).sum(1)
    assert torch.allclose(diff, a[:, None] * shifted, atol=1e-3)
    assert ((a >= 0.9) & (a <= 1.1)).all()
    b = out_x[:, 1].flatten(1)[:, 0] - a
    assert (b.abs() <= 0.1 + 1e-6).all()


def test_transforms_vary_and_cover_rotations() -> None:
    images, labels = batch(64, (16, 16))
    _, out = augment(images, labels, torch.Generator().manual_seed(0))
    changed = [(not torch.equal(o, y)) for o, y in zip(out, labels, strict=True)]
    assert 0 < sum(changed) < 64  # identity is one of the 16 flip/rotation combinations
    seen = set()
    for o, y in zip(out, labels, strict=True):
        for k in range(4):
            for flip in (False, True):
                cand = torch.rot90(y.flip(-1) if flip else y, k, dims=(-2, -1))
                if torch.equal(o, cand):
                    seen.add((k, flip))
    assert len(seen) >= 6


def test_deterministic_given_generator() -> None:
    images, labels = batch(6, (4, 8, 8))
    a = augment(images, labels, torch.Generator().manual_seed(9))
    b = augment(images, labels, torch.Generator().manual_seed(9))
    c = augment(images, labels, torch.Generator().manual_seed(10))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_non_square_planes_only_rotate_by_180() -> None:
    images, labels = batch(32, (6, 10))
    _out_x, out_y = augment(images, labels, torch.Generator().manual_seed(1))
    assert out_y.shape == (32, 6, 10)


def test_inputs_are_not_modified_and_shapes_checked() -> None:
    images, labels = batch(4, (8, 8))
    before = images.clone(), labels.clone()
    augment(images, labels, torch.Generator().manual_seed(0))
    assert torch.equal(images, before[0]) and torch.equal(labels, before[1])
    with pytest.raises(ValueError, match=r"must agree"):
        augment(images, labels[:, :4], torch.Generator())
