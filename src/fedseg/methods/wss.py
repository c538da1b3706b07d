"""The dual-decoder weakly-supervised option of the FedLPPA comparison (paper Table VI).

FedAvg, FedProx, FedBN, FedRep and FedALA (and FT, which is FedAvg plus fine-tuning) accept
``wss: dual_decoder``: the network gains an auxiliary decoder
(:class:`~fedseg.models.dual_decoder.DualDecoderUNet`) and local training uses FedLPPA's
dual-decoder pseudo-label loss (:func:`~fedseg.methods.pseudo_label.dual_decoder_loss`). The
auxiliary decoder is just more parameters: each method's own partition and aggregation rule
decide what happens to it. Evaluation uses the main decoder (``forward`` of the network).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.base import ClientContext, Method, MethodConfig
from fedseg.methods.pseudo_label import dual_decoder_loss
from fedseg.methods.training import LossFn, segmentation_loss, train_steps
from fedseg.models.dual_decoder import DualDecoderUNet, DualOutputs

__all__ = ["WSSConfig", "WSSMethod"]


class WSSConfig(MethodConfig):
    """Settings of the weak-supervision paradigm shared by the Table VI baselines."""

    wss: Literal["single", "dual_decoder"] = "single"
    """``single``: UNet + ``train.loss``; ``dual_decoder``: UNet + auxiliary decoder trained
    with FedLPPA's pCE + pseudo-label Dice loss (Eqs. 14-17)."""
    wss_lambda: float = Field(0.5, ge=0)
    """Weight of the pseudo-label Dice term (FedLPPA's lambda; only with ``dual_decoder``)."""
    wss_mix: tuple[float, float] = (0.7, 1.0)
    """Range of the main decoder's mixing weight lm ~ U(low, high) (Eq. 14)."""

    @model_validator(mode="after")
    def _check_mix(self) -> WSSConfig:
        low, high = self.wss_mix
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"wss_mix must satisfy 0 <= low <= high <= 1, got {low, high}")
        return self


class WSSMethod(Method):
    """A method with the ``wss`` option: it builds the matching network and trains it with
    the matching loss through :meth:`local_train` / :meth:`training_pair`."""

    @property
    def dual(self) -> bool:
        """True when the network has an auxiliary decoder."""
        return getattr(self.config, "wss", "single") == "dual_decoder"

    def build_model(self) -> nn.Module:
        if not self.dual:
            return super().build_model()
        spec = self.spec
        return DualDecoderUNet(
            spec.in_channels, spec.num_classes, ndim=spec.ndim, **self.unet_kwargs()
        )

    def training_pair(self, model: nn.Module, ctx: ClientContext) -> tuple[nn.Module, LossFn]:
        """``(module to call on a batch, loss of its output and the labels)``.

        In ``dual_decoder`` mode the module returns both decoders' logits and the loss is
        FedLPPA's; its mixing weights are drawn from ``ctx.generator`` (reproducible).
        """
        if not self.dual:
            return model, segmentation_loss(ctx)
        if not isinstance(model, DualDecoderUNet):
            raise ConfigError(
                f"wss: dual_decoder needs a DualDecoderUNet, got {type(model).__name__}"
            )
        cfg = self.config
        low, high = cfg.wss_mix  # type: ignore[attr-defined]
        spec = ctx.spec

        def loss(outputs: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
            value, _ = dual_decoder_loss(
                *outputs,
                labels,
                ignore_index=spec.ignore_index,
                num_classes=spec.num_classes,
                generator=ctx.generator,
                lam=cfg.wss_lambda,  # type: ignore[attr-defined]
                mix_low=low,
                mix_high=high,
            )
            return value

        return DualOutputs(model), loss  # type: ignore[return-value]

    def local_train(
        self,
        model: nn.Module,
        ctx: ClientContext,
        *,
        params: Iterable[nn.Parameter] | None = None,
        iters: int | None = None,
        regularizer: Callable[[], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """:func:`~fedseg.methods.training.train_steps` with this method's network view and
        loss (see :meth:`training_pair`)."""
        net, loss = self.training_pair(model, ctx)
        return train_steps(net, ctx, loss, params=params, iters=iters, regularizer=regularizer)
