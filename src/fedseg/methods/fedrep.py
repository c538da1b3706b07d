"""FedRep (Collins et al., ICML 2021): shared representation, local head, head-then-body."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal

from pydantic import Field, PositiveInt, model_validator
from torch import nn

from fedseg.methods.base import ClientContext, Payload
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.partition import Partition
from fedseg.methods.registry import register_method
from fedseg.methods.wss import WSSConfig

__all__ = ["HEADS", "FedRep", "heads"]

HEADS = ("decoder.head.", "aux_decoder.head.")
"""Prefixes of the task heads: the main decoder's and, with ``wss: dual_decoder``, the
auxiliary decoder's final convolution."""


def heads(model: nn.Module) -> list[str]:
    """Partition selector: the state-dict keys of the model's task head(s)."""
    return [k for k in model.state_dict() if k.startswith(HEADS)]


@contextmanager
def trainable_only(model: nn.Module, names: set[str]) -> Iterator[list[nn.Parameter]]:
    """Freeze every parameter not in ``names`` (no gradient is computed for it) and yield the
    others; ``requires_grad`` is restored on exit."""
    params = dict(model.named_parameters())
    before = {n: p.requires_grad for n, p in params.items()}
    try:
        for n, p in params.items():
            p.requires_grad_(before[n] and n in names)
        yield [p for n, p in params.items() if p.requires_grad]
    finally:
        for n, p in params.items():
            p.requires_grad_(before[n])


@register_method("fedrep")
class FedRep(FedAvg):
    """Each round a site first trains its own head with the body frozen, then the body with
    its head frozen; the server averages the body (encoder, decoder blocks, BN) by sample
    count. The head never leaves the site.

    ``schedule: joint`` trains head and body together instead (one phase of
    round's steps), as the segmentation reference code of FedDP and the
    virtual-class paper (jcwang123/PFL-Seg-Trans ``--fl fedrep``) does.

    ``wss: dual_decoder`` adds FedLPPA's auxiliary decoder; its head is local as well.

    Reference: Collins et al., "Exploiting Shared Representations for Personalized Federated
    Learning", ICML 2021.
    """

    class Config(WSSConfig):
        """FedRep settings (plus the ``wss`` option)."""

        replaces: ClassVar[dict[str, str]] = {"head_iters": "head_epochs"}

        schedule: Literal["alternating", "joint"] = "alternating"
        """``alternating``: head phase then body phase (the paper); ``joint``: head and body
        trained together for one round's steps (PFL-Seg-Trans)."""
        head_iters: int | None = Field(None, ge=0)
        """Head-only optimiser steps per round, body frozen (default: ``head_epochs`` times
        one round's steps)."""
        head_epochs: PositiveInt = 1
        """Length of the head phase in rounds' steps (``train.local_epochs: 1``: epochs);
        FedRep's code trains the head 10 epochs, then the body 1 (CIFAR-10)."""
        body_iters: int | None = Field(None, ge=0)
        """Body-only optimiser steps per round, head frozen (default: one round's steps,
        ``train.local_iters`` or ``local_epochs`` passes)."""

        @model_validator(mode="after")
        def _some_training(self) -> FedRep.Config:
            if self.head_iters == 0 and self.body_iters == 0:
                raise ValueError("head_iters and body_iters are both 0: nothing would be trained")
            phases = {k for k in ("head_iters", "body_iters") if getattr(self, k) is not None}
            if self.schedule == "joint" and (phases or self.head_epochs != 1):
                raise ValueError(
                    "head_iters / head_epochs / body_iters apply to schedule: alternating only; "
                    "schedule: joint trains one round's steps"
                )
            return self

    config: Config
    partition = Partition(private=(heads,))
    personalized = True
    summary = "FedRep: local head trained first (body frozen), then shared body (head frozen)"

    def train_round(self, payload: Payload, ctx: ClientContext) -> dict[str, float]:
        model, cfg = ctx.model, self.config
        if cfg.schedule == "joint":
            return self.local_train(model, ctx)
        head = set(self.parts(model).private)
        body = {n for n, _ in model.named_parameters()} - head
        n_head = cfg.head_epochs * ctx.steps() if cfg.head_iters is None else cfg.head_iters
        n_body = ctx.steps() if cfg.body_iters is None else cfg.body_iters
        metrics: dict[str, float] = {}
        for phase, names, iters in (("head", head, n_head), ("body", body, n_body)):
            if iters == 0:
                continue
            with trainable_only(model, names) as params:
                out = self.local_train(model, ctx, params=params, iters=iters)
            metrics |= {k: v for k, v in out.items() if k != "loss"}  # e.g. codebook usage
            metrics[f"loss_{phase}"] = out["loss"]
        metrics["loss"] = metrics.get("loss_body", metrics.get("loss_head", 0.0))
        return metrics
