"""Losses: hand-computed values, ignored pixels, empty batches and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedseg.losses import DiceBCELoss, PartialCrossEntropy, SoftDiceLoss

SMOOTH = 1e-5


def _dice(inter: float, p: float, t: float) -> float:
    return (2 * inter + SMOOTH) / (p + t + SMOOTH)


# PartialCrossEntropy ------------------------------------------------------------------

# zero logits: every labeled pixel costs log(3), however many pixels are ignored
TEST_CASE_PCE_UNIFORM = [
    torch.zeros(2, 3, 4, 4),
    torch.tensor([0, 1, 2, 3]).repeat(2, 4, 1),
    math.log(3),
]
_LOGITS = torch.tensor([[0.0, math.log(3)], [5.0, -5.0]]).T.reshape(1, 2, 1, 2)
# one labeled pixel of class 0 with probabilities (1/4, 3/4): loss log(4); pixel 2 ignored
TEST_CASE_PCE_ONE_PIXEL = [_LOGITS, torch.tensor([[[0, 2]]]), math.log(4)]


@pytest.mark.parametrize(
    ("logits", "target", "expected"),
    [TEST_CASE_PCE_UNIFORM, TEST_CASE_PCE_ONE_PIXEL],
)
def test_pce_hand_computed(logits, target, expected):
    ignore = logits.shape[1]
    assert PartialCrossEntropy(ignore)(logits, target).item() == pytest.approx(expected)


@pytest.mark.parametrize("spatial", [(5, 6), (3, 4, 5)])
def test_pce_equals_ce_over_labeled_pixels(spatial):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, *spatial, generator=g)
    target = torch.randint(0, 4, (2, *spatial), generator=g)  # 3 = unlabeled
    keep = target != 3
    want = F.cross_entropy(logits.movedim(1, -1)[keep], target[keep])
    assert PartialCrossEntropy(3)(logits, target).item() == pytest.approx(want.item())
    assert PartialCrossEntropy(3)(logits, target[:, None]).item() == pytest.approx(want.item())


def test_pce_without_labeled_pixels_is_zero_with_gradient():
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    loss = PartialCrossEntropy(3)(logits, torch.full((2, 4, 4), 3))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_pce_gradient_flows():
    logits = torch.zeros(1, 3, 2, 2, requires_grad=True)
    PartialCrossEntropy(3)(logits, torch.tensor([[[0, 3], [3, 3]]])).backward()
    # only the labeled pixel moves: d/dz of -log softmax_0 at uniform logits = (p - onehot)
    assert logits.grad[0, :, 0, 0].tolist() == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
    assert logits.grad[0, :, 1, :].abs().sum() == 0


# SoftDiceLoss ---------------------------------------------------------------------------

# two pixels: probabilities (1/2, 1/2) labeled 0 and (1/4, 3/4) labeled 1
_TWO = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]]).T.reshape(1, 2, 1, 2)
_DICE0, _DICE1 = _dice(0.5, 0.75, 1.0), _dice(0.75, 1.25, 1.0)
TEST_CASE_DICE_ALL = [_TWO, torch.tensor([[[0, 1]]]), {}, 1 - (_DICE0 + _DICE1) / 2]
TEST_CASE_DICE_FG = [_TWO, torch.tensor([[[0, 1]]]), {"include_background": False}, 1 - _DICE1]
# with pixel 0 unlabeled, only pixel 1 counts: class 0 (0 + s)/(1/4 + s), class 1 1.5/1.75
TEST_CASE_DICE_IGNORE = [
    _TWO,
    torch.tensor([[[2, 1]]]),
    {"ignore_index": 2},
    1 - (_dice(0.0, 0.25, 0.0) + _dice(0.75, 0.75, 1.0)) / 2,
]


@pytest.mark.parametrize(
    ("logits", "target", "kwargs", "expected"),
    [TEST_CASE_DICE_ALL, TEST_CASE_DICE_FG, TEST_CASE_DICE_IGNORE],
)
def test_soft_dice_hand_computed(logits, target, kwargs, expected):
    got = SoftDiceLoss(2, **kwargs)(logits, target).item()
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("spatial", [(6, 5), (3, 4, 5)])
def test_soft_dice_ignored_pixels_do_not_matter(spatial):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, *spatial, generator=g)
    target = torch.randint(0, 3, (2, *spatial), generator=g)
    loss = SoftDiceLoss(3, ignore_index=3)
    masked = target.clone()
    masked[..., -1] = 3
    other = logits.clone()
    other[..., -1] = torch.randn(other[..., -1].shape, generator=g) * 10
    assert loss(logits, masked).item() == pytest.approx(loss(other, masked).item(), rel=1e-6)
    # equal to the loss on the labeled part alone
    assert loss(logits, masked).item() == pytest.approx(
        loss(logits[..., :-1], target[..., :-1]).item(), rel=1e-6
    )


def test_soft_dice_per_sample_vs_batch():
    logits = torch.zeros(2, 2, 1, 2)
    target = torch.tensor([[[1, 1]], [[0, 0]]])
    batch = SoftDiceLoss(2)(logits, target).item()
    per_sample = SoftDiceLoss(2, batch=False)(logits, target).item()
    # batch: each class has I = 1, P = 2, T = 2 -> Dice 1/2; per sample the absent class of
    # each sample scores (0 + s)/(1 + s), the present one 2/3
    assert batch == pytest.approx(1 - _dice(1.0, 2.0, 2.0))
    assert per_sample == pytest.approx(1 - (_dice(1.0, 1.0, 2.0) + _dice(0.0, 1.0, 0.0)) / 2)


def test_soft_dice_gradient_flows_and_perfect_is_zero():
    target = torch.tensor([[[0, 1], [2, 1]]])
    logits = (F.one_hot(target, 3).movedim(-1, 1).float() * 30).requires_grad_()
    loss = SoftDiceLoss(3)(logits, target)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    noisy = torch.randn(1, 3, 2, 2, requires_grad=True)
    SoftDiceLoss(3, ignore_index=3)(noisy, torch.tensor([[[0, 3], [2, 1]]])).backward()
    assert torch.isfinite(noisy.grad).all() and noisy.grad[..., 0, 0].abs().sum() > 0
    assert noisy.grad[..., 0, 1].abs().sum() == 0


def test_soft_dice_all_ignored_is_finite():
    logits = torch.randn(1, 2, 3, 3, requires_grad=True)
    loss = SoftDiceLoss(2, ignore_index=2)(logits, torch.full((1, 3, 3), 2))
    loss.backward()
    assert loss.item() == pytest.approx(0.0) and torch.isfinite(logits.grad).all()


# DiceBCELoss ----------------------------------------------------------------------------


def test_dice_bce_hand_computed():
    # z = 0: p = 1/2 everywhere, BCE = log 2; two of four pixels are foreground
    target = torch.tensor([[[0, 1], [1, 0]]])
    loss = DiceBCELoss()(torch.zeros(1, 1, 2, 2), target)
    assert loss.item() == pytest.approx(1 - _dice(1.0, 2.0, 2.0) + math.log(2), rel=1e-6)
    weighted = DiceBCELoss(lambda_dice=0.0, lambda_bce=2.0)(torch.zeros(1, 1, 2, 2), target)
    assert weighted.item() == pytest.approx(2 * math.log(2))


@pytest.mark.parametrize("spatial", [(4, 5), (2, 3, 4)])
def test_dice_bce_two_channels_equal_foreground_logit(spatial):
    g = torch.Generator().manual_seed(2)
    two = torch.randn(2, 2, *spatial, generator=g)
    target = torch.randint(0, 2, (2, *spatial), generator=g)
    one = two[:, 1:] - two[:, :1]
    loss = DiceBCELoss()
    assert loss(two, target).item() == pytest.approx(loss(one, target).item(), rel=1e-6)
    bce_only = DiceBCELoss(lambda_dice=0.0)(two, target[:, None])
    assert bce_only.item() == pytest.approx(F.cross_entropy(two, target).item(), rel=1e-6)


def test_dice_bce_gradient_flows():
    logits = torch.randn(2, 2, 3, 3, requires_grad=True)
    DiceBCELoss()(logits, torch.randint(0, 2, (2, 3, 3))).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


# errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss", "logits", "target", "message"),
    [
        (PartialCrossEntropy(3), torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 5), r"\(2, 4, 4\)"),
        (PartialCrossEntropy(3), torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4), "dtype"),
        (PartialCrossEntropy(3), torch.zeros(1, 3, 2), torch.tensor([[255, 0]]), r"\[0, 255\]"),
        (PartialCrossEntropy(3), torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), "spatial"),
        (SoftDiceLoss(3), torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long), "3 ch"),
        (SoftDiceLoss(2), torch.zeros(1, 2, 2, 2), torch.full((1, 2, 2), 2), r"\[0, 2\)"),
        (DiceBCELoss(), torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long), "1 or 2"),
        (DiceBCELoss(), torch.zeros(1, 1, 2, 2), torch.full((1, 2, 2), 2), r"\[0, 2\)"),
    ],
)
def test_loss_errors(loss, logits, target, message):
    with pytest.raises(ValueError, match=message):
        loss(logits, target)


def test_soft_dice_rejects_single_class():
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        SoftDiceLoss(1)


@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("include_background", [True, False])
@pytest.mark.parametrize("ndim", [2, 3])
def test_soft_dice_equals_monai_dice_loss(batch, include_background, ndim):
    from monai.losses.dice import DiceLoss

    from fedseg.losses import soft_dice_loss

    gen = torch.Generator().manual_seed(ndim)
    shape = (3, 4, *(6,) * ndim)
    probs = torch.softmax(torch.randn(shape, generator=gen), 1)
    labels = torch.randint(0, 4, (3, *(6,) * ndim), generator=gen)
    onehot = torch.nn.functional.one_hot(labels, 4).movedim(-1, 1).float()
    ref = DiceLoss(
        include_background=include_background, batch=batch, smooth_nr=1e-5, smooth_dr=1e-5
    )
    ours = soft_dice_loss(probs, onehot, include_background=include_background, batch=batch)
    torch.testing.assert_close(ours, ref(probs, onehot), rtol=0, atol=1e-6)
    z = torch.randn(2, 1, *(6,) * ndim, generator=gen)
    y = (torch.rand(2, 1, *(6,) * ndim, generator=gen) > 0.5).float()
    ref_sig = DiceLoss(sigmoid=True, batch=batch, smooth_nr=1e-5, smooth_dr=1e-5)
    torch.testing.assert_close(
        soft_dice_loss(torch.sigmoid(z), y, batch=batch), ref_sig(z, y), rtol=0, atol=1e-7
    )
