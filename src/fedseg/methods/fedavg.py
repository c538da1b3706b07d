"""FedAvg (McMahan et al., AISTATS 2017): sample-weighted averaging of all weights."""

from __future__ import annotations

from collections.abc import Mapping

from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.registry import register_method
from fedseg.methods.wss import WSSConfig, WSSMethod

__all__ = ["FedAvg"]


@register_method("fedavg")
class FedAvg(WSSMethod):
    """Every site trains the global model locally; the server averages by sample count.

    ``wss: dual_decoder`` adds FedLPPA's auxiliary decoder and pseudo-label loss (Table VI);
    the auxiliary decoder is averaged like every other weight.

    Reference: McMahan et al., "Communication-Efficient Learning of Deep Networks from
    Decentralized Data", AISTATS 2017.
    """

    class Config(WSSConfig):
        """FedAvg settings: only the ``wss`` option."""

    summary = "FedAvg: global model, sample-weighted average of all weights and BN statistics"

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        self.load(ctx.model, payload, state)
        metrics = self.train_round(payload, ctx)
        upload, private = self.split(ctx.model)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def train_round(self, payload: Payload, ctx: ClientContext) -> dict[str, float]:
        """Local training of ``ctx.model`` (already loaded); variants such as FedProx
        override this hook only."""
        return self.local_train(ctx.model, ctx)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        payload = Payload(weighted_average(uploads))
        return ServerResult({s.name: payload for s in ctx.spec.sites}, state)
