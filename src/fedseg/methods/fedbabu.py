"""FedBABU (Oh, Kim, Yun, ICLR 2022): body-only federation with a frozen random head, then
fine-tuning at evaluation."""

from __future__ import annotations

from torch import nn

from fedseg.methods.base import ClientContext, Payload, State
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.fedrep import heads, trainable_only
from fedseg.methods.finetune import FineTuneConfig, fine_tune
from fedseg.methods.partition import Partition
from fedseg.methods.registry import register_method

__all__ = ["FedBABU"]


@register_method("fedbabu")
class FedBABU(FedAvg):
    """Sites train only the body; the task head keeps its random initial weights (the same
    on every site, never trained, never sent) and the server averages the body by sample
    count. At evaluation each site fine-tunes a copy of (body, head) on its own data.

    Reference: Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image
    Classification", ICLR 2022; segmentation protocol of jcwang123/PFL-Seg-Trans
    (``--fl fedbabu`` then local fine-tuning of the whole network).
    """

    class Config(FineTuneConfig):
        """FedBABU settings: the fine-tuning at evaluation (``ft_*``)."""

    config: Config
    partition = Partition(private=(heads,))
    personalized = True
    summary = "FedBABU: frozen random head, body averaged; whole-network fine-tuning at evaluation"

    def train_round(self, payload: Payload, ctx: ClientContext) -> dict[str, float]:
        model = ctx.model
        body = {n for n, _ in model.named_parameters()} - set(self.parts(model).private)
        with trainable_only(model, body) as params:
            return self.local_train(model, ctx, params=params)

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        self.load(ctx.model, payload, state)
        if self.config.ft_epochs:
            fine_tune(self, ctx.model, ctx, self.config)
        return ctx.model
