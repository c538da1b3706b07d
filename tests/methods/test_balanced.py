"""The class-balanced pixel sample shared by FPL, FedProto, FedUV, FedPLVM and FedContrast:
repeating the background pixels of a batch does not move any of their losses."""

import pytest
import torch

from fedseg.methods.balanced import balanced_mean, pixel_weights, sample_pixels
from fedseg.methods.clustered_prototypes import prototype_infonce
from fedseg.methods.fedplvm import correction_loss
from fedseg.methods.fedproto import prototype_mse
from fedseg.methods.feduv import uniformity_loss, variance_loss
from fedseg.methods.fpl import fpl_losses

D = 8


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A 12 x 12 two-image batch of D-channel features, a 4 x 4 foreground square each."""
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, D, 12, 12, generator=gen)
    labels = torch.zeros(2, 12, 12, dtype=torch.long)
    labels[:, 3:7, 4:8] = 1
    feats[:, :, 3:7, 4:8] += 1.5  # the foreground differs from the background
    return feats, labels


def _oversampled(f: torch.Tensor, y: torch.Tensor, times: int = 4):
    """The same rows with every background row repeated ``times`` times."""
    bg = y == 0
    return torch.cat([f] + [f[bg]] * (times - 1)), torch.cat([y] + [y[bg]] * (times - 1))


def _protos() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    protos = torch.randn(3, D, generator=gen)
    return protos, torch.tensor([0, 1, 1]), torch.tensor([5, 7])


LOSSES = {
    "fpl L_xi + L_cu": lambda f, y, b: sum(fpl_losses(f, y, *_protos()[:2], 2, 0.02, b)),
    "fedproto MSE": lambda f, y, b: prototype_mse(f, y, _protos()[0][:2], _protos()[2], b),
    "fedplvm alpha-InfoNCE": lambda f, y, b: prototype_infonce(f, y, *_protos()[:2], 0.07, 0.25, b),
    "fedplvm correction": lambda f, y, b: correction_loss(f, y, _protos()[0][:2], _protos()[2], b),
    "fedcontrast InfoNCE": lambda f, y, b: prototype_infonce(f, y, *_protos()[:2], 0.1, 1.0, b),
    "feduv variance": lambda f, y, b: variance_loss(f[:, :2], pixel_weights(y, b)),
    "feduv uniformity": lambda f, y, b: uniformity_loss(f, pixel_weights(y, b)),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_oversampling_background_does_not_move_the_loss(name):
    loss = LOSSES[name]
    feats, labels = _batch()
    f, y = sample_pixels(feats, labels, 2, 4096, torch.Generator().manual_seed(0))
    assert (y == 0).sum() == 256 and (y == 1).sum() == 32  # the cap does not bind
    more_f, more_y = _oversampled(f, y)
    balanced = loss(f, y, "classes")
    assert torch.isfinite(balanced) and balanced != 0
    torch.testing.assert_close(loss(more_f, more_y, "classes"), balanced)
    # the plain pixel mean is what moved (the test can fail)
    assert not torch.allclose(loss(more_f, more_y, "pixels"), loss(f, y, "pixels"))


def test_weights_give_every_class_the_same_total():
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 2])
    w = pixel_weights(y)
    totals = torch.zeros(3).index_add_(0, y, w)
    torch.testing.assert_close(totals, torch.full((3,), 1 / 3))
    torch.testing.assert_close(pixel_weights(y, "pixels"), torch.full((9,), 1 / 9))
    values = torch.tensor([1.0, 1, 1, 1, 1, 1, 4, 4, 10])
    assert float(balanced_mean(values, y)) == pytest.approx(5.0)  # (1 + 4 + 10) / 3
    empty = torch.zeros(0, requires_grad=True)
    zero = balanced_mean(empty, torch.zeros(0, dtype=torch.long))
    assert zero == 0 and zero.requires_grad
