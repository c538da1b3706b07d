"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term on the local objective."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from pydantic import Field
from torch import nn

from fedseg.methods.base import ClientContext, FederationSpec, Payload
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.registry import register_method
from fedseg.methods.wss import WSSConfig
from fedseg.models.registry import ModelConfig

__all__ = ["FedProx", "proximal_term"]

log = logging.getLogger(__name__)


def proximal_term(
    model: nn.Module, reference: dict[str, torch.Tensor], mu: float
) -> Callable[[], torch.Tensor]:
    """``() -> mu/2 * sum ||w - w_ref||^2`` over the trainable parameters named in
    ``reference`` (buffers such as BN statistics are never penalised).

    The squared norm, on every step from the first, as in the paper (the PersonalizedFL and
    FedLPPA ports use the unsquared norm and skip the first step).
    """
    pairs = [
        (p, reference[n].to(p.device).detach())
        for n, p in model.named_parameters()
        if p.requires_grad and n in reference
    ]
    if not pairs:
        raise ValueError("proximal_term: no trainable parameter of the model is in the reference")

    def term() -> torch.Tensor:
        total = sum(((p - ref) ** 2).sum() for p, ref in pairs)
        return 0.5 * mu * total  # type: ignore[return-value]

    return term


@register_method("fedprox")
class FedProx(FedAvg):
    """FedAvg whose sites minimise ``F_k(w) + mu/2 ||w - w_global||^2`` over shared weights.

    Reference: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.
    """

    class Config(WSSConfig):
        """FedProx settings (plus the ``wss`` option)."""

        mu: float = Field(0.01, ge=0)
        """Proximal coefficient; 0 reduces FedProx to FedAvg."""

    config: Config
    summary = "FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2 in local training"

    def __init__(
        self, config: Config, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        if config.mu == 0:
            log.warning("fedprox with mu=0 is FedAvg (the proximal term vanishes)")

    def train_round(self, payload: Payload, ctx: ClientContext) -> dict[str, float]:
        shared = {k: payload.tensors[k] for k in self.parts(ctx.model).upload}
        prox = proximal_term(ctx.model, shared, self.config.mu)
        metrics = self.local_train(ctx.model, ctx, regularizer=prox)
        metrics["prox"] = float(prox().detach())
        return metrics
