"""FedLPPA's dual-decoder weakly-supervised loss (paper Sec. III-C, Eqs. 14-17).

Used by FedLPPA and by the "dual-decoder WSS option" of the FedAvg/FedProx/FedBN/FedRep/
FedALA baselines (the paper's Table VI)::

    L_wss = L_sup + lam * L_pse                                           (15)
    L_sup = 0.5 pCE(main, y) + 0.5 pCE(aux, y)                            (16)
    y~    = argmax(lm * softmax(main) + (1 - lm) * softmax(aux)),  lm ~ U(0.7, 1)   (14)
    L_pse = 0.5 Dice(main, y~) + 0.5 Dice(aux, y~)                        (17)

The pseudo label is detached (no gradient flows through the arg-max target); ``lm`` is drawn
once per call from the caller's generator, so a client step stays reproducible.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from fedseg.losses import PartialCrossEntropy, SoftDiceLoss

__all__ = ["dual_decoder_loss", "pseudo_label"]


@lru_cache(maxsize=16)
def _losses(ignore_index: int, num_classes: int) -> tuple[PartialCrossEntropy, SoftDiceLoss]:
    return PartialCrossEntropy(ignore_index), SoftDiceLoss(num_classes)


@torch.no_grad()
def pseudo_label(main_logits: torch.Tensor, aux_logits: torch.Tensor, mix: float) -> torch.Tensor:
    """Eq. 14: arg-max of the ``mix``-weighted mixture of the two softmax outputs."""
    probs = mix * main_logits.softmax(1) + (1 - mix) * aux_logits.softmax(1)
    return probs.argmax(1)


def dual_decoder_loss(
    main_logits: torch.Tensor,
    aux_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int,
    num_classes: int,
    generator: torch.Generator,
    lam: float = 0.5,
    mix_low: float = 0.7,
    mix_high: float = 1.0,
    aux_pce: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eqs. 14-17 on one batch: ``(loss, parts)``.

    Args:
        main_logits, aux_logits: ``[B, C, *S]`` logits of the main and auxiliary decoders.
        labels: ``[B, *S]`` sparse labels; unlabeled pixels equal ``ignore_index``.
        generator: CPU generator the mixing weight ``lm ~ U(mix_low, mix_high)`` is drawn from.
        lam: weight of the pseudo-label Dice term (paper: 0.5).
        aux_pce: supervise both decoders, ``(pCE_main + pCE_aux) / 2`` (Eq. 16); else the
            main decoder's pCE alone (FedLPPA's code).

    Returns:
        The scalar loss and its parts as floats: ``sup``, ``pse``, ``pce_main``,
        ``pce_aux``, ``dice_main``, ``dice_aux`` and the drawn ``mix``.
    """
    if main_logits.shape != aux_logits.shape:
        raise ValueError(
            f"dual_decoder_loss: main and aux logits must have the same shape, got "
            f"{tuple(main_logits.shape)} and {tuple(aux_logits.shape)}"
        )
    if not 0.0 <= mix_low <= mix_high <= 1.0:
        raise ValueError(
            f"dual_decoder_loss: need 0 <= mix_low <= mix_high <= 1, got {mix_low}, {mix_high}"
        )
    pce, dice = _losses(ignore_index, num_classes)
    mix = mix_low + (mix_high - mix_low) * float(torch.rand((), generator=generator))
    target = pseudo_label(main_logits.detach(), aux_logits.detach(), mix)
    pce_main, pce_aux = pce(main_logits, labels), pce(aux_logits, labels)
    dice_main, dice_aux = dice(main_logits, target), dice(aux_logits, target)
    sup = 0.5 * pce_main + 0.5 * pce_aux if aux_pce else pce_main
    pse = 0.5 * dice_main + 0.5 * dice_aux
    parts = {
        "sup": sup,
        "pse": pse,
        "pce_main": pce_main,
        "pce_aux": pce_aux,
        "dice_main": dice_main,
        "dice_aux": dice_aux,
    }
    out = {k: float(v.detach()) for k, v in parts.items()}
    out["mix"] = mix
    return sup + lam * pse, out
