"""Resampling to a target spacing keeps physical geometry; masks keep their label values."""

from __future__ import annotations

import numpy as np
import pytest

from fedseg.data.resample import resample_image, resample_mask, resampled_shape
from fedseg.errors import DataError


def _centre_mm(mask: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    """Physical centre of mass of a binary mask, voxel i centred at (i + 1/2) * spacing."""
    idx = np.argwhere(mask > 0).mean(axis=0)
    return (idx + 0.5) * np.asarray(spacing)


def test_two_mm_box_resampled_to_one_mm_doubles_its_extent():
    mask = np.zeros((10, 12), np.uint8)
    mask[2:6, 3:8] = 1  # 4 x 5 voxels at 2 mm: 8 x 10 mm
    out = resample_mask(mask, (2.0, 2.0), (1.0, 1.0))
    assert out.shape == (20, 24)
    rows, cols = np.nonzero(out)
    assert (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) == (4, 12, 6, 16)
    image = resample_image(mask.astype(np.float32), (2.0, 2.0), (1.0, 1.0))
    assert image.dtype == np.float32 and image.shape == (20, 24)
    assert np.count_nonzero(image >= 0.5) == 8 * 10


def test_downsampling_halves_the_extent_and_keeps_the_centre():
    mask = np.zeros((16, 16), np.uint8)
    mask[4:12, 2:10] = 1
    out = resample_mask(mask, (0.5, 0.5), (1.0, 1.0))
    assert out.shape == (8, 8)
    assert np.count_nonzero(out) == 4 * 4
    np.testing.assert_allclose(_centre_mm(out, (1.0, 1.0)), _centre_mm(mask, (0.5, 0.5)))


def test_anisotropic_volume_to_isotropic():
    mask = np.zeros((4, 6, 6), np.uint8)
    mask[1:3, 2:4, 1:5] = 1  # 2 slices at 3 mm = 6 mm thick
    out = resample_mask(mask, (3.0, 1.0, 1.0), (1.0, 1.0, 1.0))
    assert out.shape == (12, 6, 6)
    assert np.count_nonzero(out.any(axis=(1, 2))) == 6  # 6 mm thick at 1 mm
    np.testing.assert_allclose(_centre_mm(out, (1, 1, 1)), _centre_mm(mask, (3, 1, 1)))
    np.testing.assert_array_equal(out[:, 2:4, 1:5].any(axis=(1, 2)), np.repeat([0, 1, 1, 0], 3))


def test_masks_keep_label_values_and_dtype():
    rng = np.random.default_rng(0)
    mask = rng.choice(np.array([0, 3, 7], np.uint8), size=(9, 7, 5))
    out = resample_mask(mask, (1.3, 0.7, 2.0), (0.9, 1.1, 0.8))
    assert out.dtype == np.uint8
    assert set(np.unique(out).tolist()) == {0, 3, 7}
    assert out.shape == resampled_shape(mask.shape, (1.3, 0.7, 2.0), (0.9, 1.1, 0.8))


def test_linear_and_cubic_reproduce_a_ramp_at_the_new_voxel_centres():
    x = (np.arange(10) + 0.5) * 2.0  # voxel centres in mm at 2 mm
    ramp = np.tile(x, (3, 1)).astype(np.float32)
    for interpolation, margin, atol in (("linear", 0, 1e-4), ("cubic", 3, 1e-2)):
        out = resample_image(ramp, (1.0, 2.0), (1.0, 0.5), interpolation)
        assert out.shape == (3, 40)
        centres = (np.arange(40) + 0.5) * 0.5
        # edges are replicated, not extrapolated; the cubic spline's edge effect decays inwards
        inner = (centres >= x[margin]) & (centres <= x[-1 - margin])
        np.testing.assert_allclose(out[0, inner], centres[inner], atol=atol)


def test_channels_are_resampled_alike():
    image = np.stack([np.arange(24.0).reshape(4, 6), -np.arange(24.0).reshape(4, 6)])
    out = resample_image(image, (1.0, 1.0), (0.5, 0.5))
    assert out.shape == (2, 8, 12)
    np.testing.assert_allclose(out[1], -out[0])


def test_same_spacing_is_the_identity():
    image = np.random.default_rng(1).random((5, 6, 7)).astype(np.float32)
    np.testing.assert_array_equal(resample_image(image, (1, 2, 3), (1, 2, 3)), image)


@pytest.mark.parametrize(
    ("spacing", "target"),
    [
        ((1.0, 1.0), (1.0, 0.0)),
        ((1.0, -1.0), (1.0, 1.0)),
        ((1.0,), (1.0, 1.0)),
        ((1.0, float("nan")), (1.0, 1.0)),
    ],
)
def test_bad_spacings_are_refused(spacing, target):
    with pytest.raises(DataError, match="spacing"):
        resample_image(np.zeros((4, 4)), spacing, target)


def test_mask_with_channel_axis_and_unknown_interpolation_are_refused():
    with pytest.raises(DataError, match="spatial axes only"):
        resample_mask(np.zeros((1, 4, 4), np.uint8), (1.0, 1.0), (1.0, 1.0))
    with pytest.raises(DataError, match="interpolation"):
        resample_image(np.zeros((4, 4)), (1.0, 1.0), (2.0, 2.0), "bspline")  # type: ignore[arg-type]
