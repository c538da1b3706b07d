"""``resize_nearest`` gives what ``F.interpolate(mode="nearest")`` gives, gradients included,
for integer up- and downsampling in 2D and 3D, any memory layout, and other sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedseg.models.layers import resize_nearest

CASES = [
    ((2, 3, 4, 5), (8, 15)),  # up x2, x3
    ((2, 3, 8, 8), (32, 32)),  # up x4
    ((2, 3, 16, 12), (4, 3)),  # down /4
    ((2, 3, 9, 9), (6, 4)),  # neither: falls back to F.interpolate
    ((1, 2, 3, 4, 2), (6, 8, 6)),  # 3D up
    ((1, 2, 8, 6, 4), (4, 3, 2)),  # 3D down
]


@pytest.mark.parametrize(("shape", "size"), CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_interpolate_values_and_gradients(shape, size, channels_last):
    x = torch.randn(shape)
    if channels_last:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got, want = resize_nearest(a, size), F.interpolate(b, size=size, mode="nearest")
    assert torch.equal(got, want)
    g = torch.randn(want.shape)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(a.grad, b.grad)
    assert resize_nearest(x, shape[2:]) is x  # same size: unchanged
