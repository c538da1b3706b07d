"""``augment``: labels follow images exactly, deterministic per generator, 2D and 3D."""

from __future__ import annotations

import math

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


def bar_batch(n: int, size: int = 33) -> tuple[torch.Tensor, torch.Tensor]:
    """A horizontal bar (label 1) through the centre of a square image equal to the label."""
    labels = torch.zeros(n, size, size, dtype=torch.long)
    labels[:, size // 2 - 2 : size // 2 + 3, 4:-4] = 1
    return labels[:, None].float(), labels


def bar_angle(label: torch.Tensor) -> float:
    """Orientation in degrees (-90, 90] of the label-1 pixels' principal axis."""
    ys, xs = torch.nonzero(label == 1, as_tuple=True)
    cov = torch.cov(torch.stack([xs.float(), ys.float()]))
    vec = torch.linalg.eigh(cov)[1][:, -1]
    angle = math.degrees(math.atan2(float(vec[1]), float(vec[0])))
    return (angle + 90) % 180 - 90


def test_paper_45_rotates_by_any_angle_within_45_degrees() -> None:
    images, labels = bar_batch(64)
    _, out = augment(images, labels, torch.Generator().manual_seed(0), rotation="paper_45")
    angles = [bar_angle(o) for o in out]
    assert max(abs(a) for a in angles) <= 46  # flips mirror the angle; never beyond 45
    assert min(angles) < -20 and max(angles) > 20  # both directions, not just right angles
    assert sum(5 < abs(a) < 40 for a in angles) > 20  # mostly non-right angles


def test_paper_45_keeps_labels_on_their_pixels_and_marks_the_outside_ignored() -> None:
    labels = torch.zeros(16, 32, 32, dtype=torch.long)
    labels[:, 8:24, 6:20] = 1
    labels[:, 12:20, 20:28] = 2
    images = labels[:, None].float()
    out_x, out_y = augment(
        images, labels, torch.Generator().manual_seed(1), rotation="paper_45", ignore_index=255
    )
    assert out_y.dtype == labels.dtype and out_y.shape == labels.shape
    assert set(out_y.unique().tolist()) <= {0, 1, 2, 255}
    assert (out_y == 255).any()  # corners rotated in from outside the image
    assert (out_y[:, 16, 16] != 255).all()  # the centre never leaves the image
    for x, y in zip(out_x[:, 0], out_y, strict=True):  # x = a * label + b away from edges
        on = y != 255
        a_b = torch.linalg.lstsq(
            torch.stack([y[on].float(), torch.ones(int(on.sum()))], 1), x[on][:, None]
        ).solution
        resid = (x[on] - (a_b[0] * y[on].float() + a_b[1])).abs()
        assert (resid < 0.3).float().mean() > 0.9  # bilinear image edges vs nearest labels


def test_paper_45_on_volumes_is_deterministic_and_rotates_every_slice_alike() -> None:
    labels = torch.zeros(4, 3, 16, 16, dtype=torch.long)
    labels[:, :, 4:12, 2:9] = 1
    images = torch.stack([labels.float(), torch.ones_like(labels, dtype=torch.float)], 1)
    a = augment(images, labels, torch.Generator().manual_seed(4), rotation="paper_45")
    b = augment(images, labels, torch.Generator().manual_seed(4), rotation="paper_45")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == images.shape and a[1].shape == labels.shape
    assert torch.equal(a[1][:, 0], a[1][:, 2])  # identical slices stay identical
    with pytest.raises(ValueError, match="rotation"):
        augment(images, labels, torch.Generator(), rotation="45")  # type: ignore[arg-type]
