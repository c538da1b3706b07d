"""FedDP (Wang, Jin, Stoyanov, Wang, TMI 2023): dual personalisation of a PVTv2 + FPN
segmenter by local queries (LQ) and inconsistency-guided calibration (IGC)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.finetune import FineTuneConfig, fine_tune
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.methods.registry import register_method
from fedseg.methods.training import segmentation_loss
from fedseg.methods.variants import Variant, VariantConfig
from fedseg.models.registry import ModelConfig, parse_model

__all__ = ["FedDP", "disagreement", "per_site", "uncertainty_weighted_bce"]

UPLOAD = "query."
"""Prefix of a site's own query tensors in its last-round upload (IGC only)."""
PEER = "peer."
"""Prefix of every site's queries in the final payload: ``peer.<site index>.<key>``."""

AUTHORS = Variant(
    method={
        "query": ("*.attn.q.*",),
        "backbone": "pvtv2_fpn",
        "aggregation": "uniform",
        "igc_lambda": 1.0,
        "ft_lr": 1e-4,
        "ft_scope": "all",
        "ft_epoch_iters": 38,
    },
    train={
        "optimizer": "adam",
        "weight_decay": 0.0,
        "lr_schedule": "constant",
        "keep_optimizer_state": True,
        "batch_size": 8,
        "local_iters": 38,
        "loss": "dice_foreground",
        "grad_clamp": 1.0,
    },
    model={"pvtv2_fpn": {"decoder_init": "torch", "upsample": "probabilities"}},
)
"""``variant: authors``: jcwang123/PFL-Seg-Trans at d715417c (``--fl ours_q``, then
``ours_q_bd_ft``), its defects excepted; the table with the source of each setting is in
docs/methods/feddp.md."""


def disagreement(probs: torch.Tensor) -> torch.Tensor:
    """IGC's inconsistency map: the standard deviation over models of the per-class
    probabilities ``probs [M, N, C, *S]``, divided by its maximum over the batch (zero when
    all models agree)."""
    u = probs.std(dim=0)
    peak = u.max()
    return u / peak if peak > 0 else u


def uncertainty_weighted_bce(
    logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """Mean over labelled pixels and classes of ``weight * BCE(softmax(logits), onehot)``."""
    labelled = labels != ignore_index
    target = F.one_hot(labels.clamp(0, logits.shape[1] - 1), logits.shape[1]).movedim(-1, 1)
    # BCE of probabilities is refused under CUDA's autocast: it runs in float32 outside it
    with torch.autocast(logits.device.type, enabled=False):
        prob = logits.float().softmax(1).clamp(1e-6, 1 - 1e-6)
        bce = F.binary_cross_entropy(prob, target.float(), reduction="none") * weight
        mask = labelled.unsqueeze(1).float()
        return (bce * mask).sum() / (mask.sum() * logits.shape[1]).clamp(min=1)


class _Ensemble(nn.Module):
    """Training view for IGC: ``forward`` gives the site model's logits and the frozen
    ensemble's disagreement map; ``net`` is the trained network (optimiser-state owner)."""

    def __init__(self, net: nn.Module, members: list[nn.Module]) -> None:
        super().__init__()
        self.net = net
        self._members = members  # a plain list: frozen, not submodules, always in eval mode

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            probs = torch.stack([m(x).softmax(1) for m in self._members])
        return self.net(x), disagreement(probs)


@register_method("feddp")
class FedDP(FedAvg):
    """Stage 1 (LQ): every attention query projection stays on its site, everything else is
    averaged by sample count. Stage 2 (IGC): after the last round each site receives every
    site's queries, rebuilds the N stage-1 models as a frozen ensemble and fine-tunes its own
    model with ``loss + igc_lambda * mean(u * BCE)``, ``u`` the ensemble's normalised
    disagreement.

    Reference: Wang, Jin, Stoyanov, Wang, "FedDP: Dual Personalization in Federated Medical
    Image Segmentation", IEEE TMI 2023; code jcwang123/FedDP = PFL-Seg-Trans
    (``--fl ours_q``, then ``ours_q_bd_ft``).
    """

    class Config(FineTuneConfig, VariantConfig):
        """FedDP settings: the local-query selector, the backbone and IGC fine-tuning."""

        variant: Literal["paper", "authors"] = "paper"
        """``paper``: the settings below as given; ``authors``: the behaviour of the
        authors' code (docs/methods/feddp.md, "variant: authors"), which a conflicting
        setting may not override."""
        variants: ClassVar[Mapping[str, Variant]] = {"authors": AUTHORS}

        query: tuple[str, ...] = ("*.attn.q.*",)
        """State-dict patterns of the personal (local-query) parameters."""
        backbone: Literal["pvtv2_fpn", "model"] = "pvtv2_fpn"
        """``pvtv2_fpn``: FedDP's PVTv2-b0 + FPN (a ``pvtv2_fpn`` model block gives its
        options; the default UNet block is replaced); ``model``: the run's ``model:`` block
        as it is (``query`` must then name its personal parameters)."""
        igc_lambda: float = Field(1.0, ge=0)
        """Weight of the inconsistency-weighted BCE (0: plain fine-tuning, no exchange)."""
        aggregation: Literal["samples", "uniform"] = "samples"
        """Averaging of the shared weights: by sample count, or uniform (the authors'
        code)."""

    config: Config
    personalized = True
    summary = "FedDP: local attention queries (LQ), then ensemble-guided fine-tuning (IGC)"

    def __init__(
        self,
        config: Config,  # type: ignore[override]
        spec: FederationSpec,
        model: ModelConfig | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(config, spec, self._backbone(config, parse_model(model)))

    @staticmethod
    def _backbone(cfg: Config, model: ModelConfig) -> ModelConfig:
        if cfg.backbone == "model" or model.name == "pvtv2_fpn":
            return model
        if model != parse_model(None):
            raise ConfigError(
                f"method.backbone: pvtv2_fpn builds FedDP's PVTv2-b0 + FPN, but the model "
                f"block sets {model.name!r} with options; use model.name: pvtv2_fpn, or "
                f"method.backbone: model with method.query naming its personal parameters"
            )
        return parse_model({"name": "pvtv2_fpn"})

    def parts(self, model: nn.Module) -> ResolvedPartition:
        if self._parts is None:
            try:
                self._parts = Partition(private=self.config.query).resolve(model)
            except ConfigError as e:
                raise ConfigError(f"method.query: {e.reason}") from None
        return self._parts

    # -- the query exchange of IGC ---------------------------------------------------------
    @property
    def igc(self) -> bool:
        """True when stage 2 needs every site's queries."""
        return self.config.ft_epochs > 0 and self.config.igc_lambda > 0

    def _queries(self, model: nn.Module) -> dict[str, TensorSpec]:
        sd = model.state_dict()
        return {
            k: TensorSpec(tuple(sd[k].shape), sd[k].dtype, True) for k in self.parts(model).private
        }

    def upload_template(self, model: nn.Module) -> Template:
        out = super().upload_template(model)
        if self.igc:
            out |= {UPLOAD + k: s for k, s in self._queries(model).items()}
        return out

    def download_template(self, model: nn.Module) -> Template:
        out = super().download_template(model)
        if self.igc:
            for i in range(len(self.spec.sites)):
                out |= {f"{PEER}{i}.{k}": s for k, s in self._queries(model).items()}
        return out

    def _last_round(self, r: int, rounds: int) -> bool:
        return self.igc and r == rounds - 1

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        weights = Payload({k: v for k, v in payload.tensors.items() if not k.startswith(PEER)})
        res = super().client_step(weights, state, ctx)
        if self._last_round(ctx.round, ctx.train.rounds):
            res.upload.tensors |= {UPLOAD + k: v.clone() for k, v in res.state["weights"].items()}
        return res

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        shared = [k for k in next(iter(uploads.values())).tensors if not k.startswith(UPLOAD)]
        weights = None
        if self.config.aggregation == "uniform":
            weights = dict.fromkeys(uploads, 1.0 / len(uploads))
        glob = weighted_average(uploads, weights, keys=shared)
        if self._last_round(ctx.round, ctx.train.rounds):
            for s, u in uploads.items():
                i = ctx.spec.site(s).index
                glob |= {
                    f"{PEER}{i}.{k.removeprefix(UPLOAD)}": v
                    for k, v in u.tensors.items()
                    if k.startswith(UPLOAD)
                }
        payload = Payload(glob)
        return ServerResult({s.name: payload for s in ctx.spec.sites}, state)

    # -- stage 2 ---------------------------------------------------------------------------
    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        cfg, model = self.config, ctx.model
        peers = per_site(payload, PEER)
        self.load(
            model,
            Payload({k: v for k, v in payload.tensors.items() if not k.startswith(PEER)}),
            state,
        )
        if cfg.ft_epochs == 0 or (self.igc and not peers):
            return model  # stage 1 only (or an evaluation before the final exchange)
        if not self.igc:
            fine_tune(self, model, ctx, cfg)
            return model
        members = []
        for queries in peers.values():
            member = copy.deepcopy(model).eval()
            member.load_state_dict({**model.state_dict(), **queries})
            member.requires_grad_(False)
            members.append(member)
        base = segmentation_loss(ctx)
        ignore, lam = ctx.spec.ignore_index, cfg.igc_lambda

        def loss(out: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
            logits, u = out
            return base(logits, labels) + lam * uncertainty_weighted_bce(logits, labels, u, ignore)

        fine_tune(self, model, ctx, cfg, objective=_Ensemble(model, members), loss_fn=loss)
        return model


def per_site(payload: Payload, prefix: str) -> dict[int, dict[str, torch.Tensor]]:
    """``{site index: {key: tensor}}`` of the tensors ``<prefix><site index>.<key>`` that
    ``payload`` carries, in site order."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in payload.tensors.items():
        if k.startswith(prefix):
            index, key = k.removeprefix(prefix).split(".", 1)
            out.setdefault(int(index), {})[key] = v
    return dict(sorted(out.items()))
