"""FedAvg (McMahan et al., AISTATS 2017): sample-weighted averaging of all weights."""

from __future__ import annotations

from collections.abc import Mapping

from fedseg.methods.aggregate import RunningAverage
from fedseg.methods.base import (
    Aggregator,
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    State,
    aggregate,
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
        return aggregate(_SampleAverage(state, ctx), uploads)

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        """A running sample-weighted average (the server holds one sum, not every upload),
        unless a subclass replaced the server step."""
        if type(self).server_step is not FedAvg.server_step:
            return super().aggregator(state, ctx)
        return _SampleAverage(state, ctx)


class _SampleAverage:
    """FedAvg's server step as a reduction: each upload is added to a running average
    weighted by its example count, so memory does not grow with the number of sites."""

    def __init__(self, state: State, ctx: ServerContext) -> None:
        self.state, self.ctx = state, ctx
        self.avg = RunningAverage()

    def add(self, site: str, upload: Payload) -> None:
        self.avg.add(upload.tensors, float(upload.num_examples))

    def finish(self) -> ServerResult:
        payload = Payload(self.avg.result())
        return ServerResult({s.name: payload for s in self.ctx.spec.sites}, self.state)
