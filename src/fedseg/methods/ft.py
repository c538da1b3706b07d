"""FT: FedAvg, then each site fine-tunes the global model locally before it is evaluated."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field, PositiveFloat, field_validator
from torch import nn

from fedseg.methods.base import ClientContext, Payload, State, TrainSettings, round_lr
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.registry import register_method
from fedseg.methods.wss import WSSConfig

__all__ = ["FineTune"]


@register_method("ft")
class FineTune(FedAvg):
    """FedAvg training; at evaluation each site fine-tunes a copy of the global model.

    The fine-tuning happens in :meth:`eval_model` on the workspace model: the payload and the
    site's stored state are left untouched, so training can resume and the global model
    stays the FedAvg model.

    Reference: the "FT" baseline of FedLPPA (Lin et al., 2024), citing Wang et al.,
    "Federated Evaluation of On-device Personalization", arXiv:1910.10252, 2019.
    """

    class Config(WSSConfig):
        """FT settings (plus the ``wss`` option)."""

        ft_iters: int = Field(10, ge=0)
        """Fine-tuning optimiser steps per site before evaluation (0 = plain FedAvg)."""
        ft_lr: Literal["last", "base"] | PositiveFloat = "last"
        """Constant fine-tuning learning rate: ``last``, the rate of the last training round
        under ``train.lr_schedule`` (fine-tuning continues where the schedule ended),
        ``base``, ``train.lr``, or a number. ``null`` (configs before 2026-11-28) is ``base``."""
        ft_scope: Literal["all", "head"] = "all"
        """Fine-tune every weight (``all``) or only ``decoder.head`` (``head``)."""

        @field_validator("ft_lr", mode="before")
        @classmethod
        def _null_is_base(cls, v: object) -> object:
            return "base" if v is None else v

        def lr(self, train: TrainSettings) -> float:
            """The fine-tuning learning rate under ``train``."""
            if self.ft_lr == "last":
                return round_lr(train, train.rounds - 1)
            return train.lr if self.ft_lr == "base" else float(self.ft_lr)

    config: Config
    personalized = True
    summary = "FT: FedAvg, then per-site fine-tuning of the global model before evaluation"

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        cfg, model = self.config, ctx.model
        self.load(model, payload, state)
        if cfg.ft_iters == 0:
            return model
        train = ctx.train.model_copy(update={"lr": cfg.lr(ctx.train), "lr_schedule": "constant"})
        params = model.decoder.head.parameters() if cfg.ft_scope == "head" else None
        self.local_train(model, replace(ctx, train=train), params=params, iters=cfg.ft_iters)
        return model
