import pytest
import torch

from fedseg.losses import PartialCrossEntropy, SoftDiceLoss
from fedseg.methods.pseudo_label import dual_decoder_loss, pseudo_label

IGNORE = 255


def _batch(seed: int = 0, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    main = torch.randn(2, classes, 8, 8, generator=g, requires_grad=True)
    aux = torch.randn(2, classes, 8, 8, generator=g, requires_grad=True)
    labels = torch.randint(0, classes, (2, 8, 8), generator=g)
    labels[torch.rand(2, 8, 8, generator=g) < 0.8] = IGNORE
    return main, aux, labels


def test_loss_equals_eqs_14_to_17():
    main, aux, labels = _batch()
    loss, parts = dual_decoder_loss(
        main,
        aux,
        labels,
        ignore_index=IGNORE,
        num_classes=3,
        generator=torch.Generator().manual_seed(3),
    )
    mix = parts["mix"]
    assert 0.7 <= mix <= 1.0
    pce, dice = PartialCrossEntropy(IGNORE), SoftDiceLoss(3)
    target = (mix * main.softmax(1) + (1 - mix) * aux.softmax(1)).argmax(1)
    expect = 0.5 * (pce(main, labels) + pce(aux, labels)) + 0.5 * 0.5 * (
        dice(main, target) + dice(aux, target)
    )
    torch.testing.assert_close(loss, expect)
    assert parts["sup"] == pytest.approx(0.5 * (parts["pce_main"] + parts["pce_aux"]))
    assert parts["pse"] == pytest.approx(0.5 * (parts["dice_main"] + parts["dice_aux"]))


def test_mix_comes_from_the_generator_and_its_range():
    main, aux, labels = _batch()
    kw = {"ignore_index": IGNORE, "num_classes": 3}
    a = dual_decoder_loss(main, aux, labels, generator=torch.Generator().manual_seed(5), **kw)[1]
    b = dual_decoder_loss(main, aux, labels, generator=torch.Generator().manual_seed(5), **kw)[1]
    assert a["mix"] == b["mix"]
    mixes = [
        dual_decoder_loss(
            main,
            aux,
            labels,
            generator=torch.Generator().manual_seed(s),
            mix_low=0.2,
            mix_high=0.4,
            **kw,
        )[1]["mix"]
        for s in range(20)
    ]
    assert all(0.2 <= m <= 0.4 for m in mixes) and len(set(mixes)) > 1


def test_pseudo_label_is_detached_and_mix_one_follows_main():
    main, aux, labels = _batch()
    assert torch.equal(pseudo_label(main, aux, 1.0), main.argmax(1))
    assert torch.equal(pseudo_label(main, aux, 0.0), aux.argmax(1))
    assert not pseudo_label(main, aux, 0.8).requires_grad
    # with lam = 0 only the supervised pCE terms carry gradient: zero on unlabeled pixels
    loss, _ = dual_decoder_loss(
        main, aux, labels, ignore_index=IGNORE, num_classes=3, generator=torch.Generator(), lam=0.0
    )
    loss.backward()
    unlabeled = (labels == IGNORE).unsqueeze(1).expand_as(main)
    assert main.grad[unlabeled].abs().max() == 0
    assert aux.grad[~unlabeled].abs().max() > 0


def test_bad_inputs_raise():
    main, aux, labels = _batch()
    with pytest.raises(ValueError, match="same shape"):
        dual_decoder_loss(
            main, aux[:1], labels, ignore_index=IGNORE, num_classes=3, generator=torch.Generator()
        )
    with pytest.raises(ValueError, match="mix_low"):
        dual_decoder_loss(
            main,
            aux,
            labels,
            ignore_index=IGNORE,
            num_classes=3,
            generator=torch.Generator(),
            mix_low=0.9,
            mix_high=0.5,
        )
