"""MetaFed (Chen et al., IEEE TNNLS 2023): cyclic knowledge distillation along a ring."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedseg.errors import ConfigError
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
    Template,
)
from fedseg.methods.fedbn import BN_LAYERS
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.methods.registry import register_method
from fedseg.methods.training import LossFn, segmentation_loss, train_steps
from fedseg.models.registry import ModelConfig

__all__ = ["MetaFed", "labeled_dice", "personal_lambda"]

NO_TEACHER = -1.0


def labeled_dice(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, spec: FederationSpec
) -> float:
    """Mean foreground Dice of ``model``'s argmax on the labeled pixels of ``labels``.

    Classes absent from both prediction and labels are skipped; 1.0 if all are. Runs the
    model in its current mode without gradient.
    """
    with torch.no_grad():
        pred = torch.cat([model(images[i : i + 16]).argmax(1) for i in range(0, len(images), 16)])
    keep = labels != spec.ignore_index
    scores = []
    for c in range(1, spec.num_classes):
        p, t = (pred == c) & keep, (labels == c) & keep
        denom = int(p.sum() + t.sum())
        if denom:
            scores.append(2.0 * int((p & t).sum()) / denom)
    return sum(scores) / len(scores) if scores else 1.0


def personal_lambda(student: float, teacher: float, lam: float, thes: float) -> float:
    """MetaFed's personalization weight from the student's and teacher's validation scores:
    0 if the teacher is no better and below ``thes``, else ``10^min(1, 5 (v2 - v1)) / 10 * lam``."""
    if teacher <= student and teacher < thes:
        return 0.0
    return 10 ** min(1.0, 5.0 * (teacher - student)) / 10.0 * lam


def teacher_mode(model: nn.Module) -> nn.Module:
    """Freeze ``model`` as a teacher: no gradients, dropout off, BN on batch statistics."""
    model.eval()
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.train()
    return model.requires_grad_(False)


class _Distill(nn.Module):
    """Student logits and penultimate feature, and the teacher's feature (no gradient)."""

    def __init__(self, student: nn.Module, teacher: nn.Module) -> None:
        super().__init__()
        self.student = student
        self.__dict__["teacher"] = teacher  # not a submodule: train() must not reach it

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.student.forward_features(x)
        with torch.no_grad():
            target = self.__dict__["teacher"].forward_features(x).decoder[-1]
        return out.logits, out.decoder[-1], target


@register_method("metafed")
class MetaFed(Method):
    """Sites form a ring in ``order``; each learns from its predecessor's model (the
    teacher). A site whose validation Dice never exceeded ``threshold`` copies the teacher's
    weights and trains; a site above it distils, ``seg + lam * MSE(f_student, f_teacher)``
    on the last decoder feature. After ``init_rounds`` of local training comes common-
    knowledge accumulation; in the last ``personal_rounds`` every site learns from the last
    ring member's model with an adaptive weight. BN layers never leave a site.

    The engine runs all client steps of a round, then the server step; so the server
    forwards to each site the model its predecessor uploaded in the previous round, and
    knowledge moves one ring hop per round (a full cycle takes ``len(order)`` rounds).

    Reference: Chen et al., "MetaFed: Federated Learning among Federations with Cyclic
    Knowledge Distillation for Personalized Healthcare", IEEE TNNLS 2023.
    """

    class Config(MethodConfig):
        """MetaFed settings."""

        order: tuple[int, ...] | None = None
        """Ring order as site indices, a permutation (default: 0, 1, ..., K-1)."""
        init_rounds: int = Field(1, ge=0)
        """Leading rounds of local training only (MetaFed's initial local epochs)."""
        personal_rounds: int = Field(1, ge=0)
        """Final rounds of personalization from the accumulated common model."""
        lam: float = Field(1.0, ge=0)
        """Weight of the feature-distillation term."""
        threshold: float = 0.6
        """Validation Dice above which a site distils instead of copying (flags never revert)."""
        thes: float = Field(0.5, ge=0, le=1)
        """Personalization: a teacher no better than the student and below this gives lam 0."""

        @field_validator("order")
        @classmethod
        def _distinct(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
            if v is not None and sorted(v) != list(range(len(v))):
                raise ValueError(f"order must be a permutation of 0..{len(v) - 1}, got {list(v)}")
            return v

    config: Config
    partition = Partition(private=(BN_LAYERS,))
    personalized = True
    summary = "MetaFed: cyclic knowledge distillation along a fixed ring of sites, BN local"

    def __init__(
        self, config: MethodConfig, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        order = self.config.order or tuple(range(len(spec.sites)))
        if len(order) != len(spec.sites):
            raise ConfigError(
                f"method.order must list all {len(spec.sites)} site indices, got {list(order)}"
            )
        self.ring = [next(s for s in spec.sites if s.index == i).name for i in order]

    # -- schedule ------------------------------------------------------------------------
    def phase(self, r: int, rounds: int) -> str:
        """``init``, ``common`` or ``personal`` for round ``r`` of ``rounds``."""
        cfg = self.config
        if cfg.init_rounds + cfg.personal_rounds > rounds:
            raise ConfigError(
                f"method.init_rounds ({cfg.init_rounds}) + method.personal_rounds "
                f"({cfg.personal_rounds}) must be <= train.rounds ({rounds})"
            )
        if r < cfg.init_rounds:
            return "init"
        return "personal" if r >= rounds - cfg.personal_rounds else "common"

    def teacher_of(self, site: str) -> str:
        """The ring predecessor of ``site`` (the first site's is the last)."""
        return self.ring[self.ring.index(site) - 1]

    def download_template(self, model: nn.Module) -> Template:
        """A teacher's uploaded weights, or nothing (no teacher this round)."""
        return {k: v._replace(optional=True) for k, v in self.upload_template(model).items()}

    # -- server --------------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        none = Payload(metrics={"teacher": NO_TEACHER})
        state = {"models": {}, "common": None, "common_from": NO_TEACHER}
        return ServerResult({s.name: none for s in self.spec.sites}, state)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        models = {**state["models"], **{s: u.tensors for s, u in uploads.items()}}
        common, source = state["common"], state["common_from"]
        phase = self.phase(ctx.round + 1, ctx.train.rounds)
        if phase == "personal" and common is None and self.ring[-1] in models:
            common, source = models[self.ring[-1]], float(self.spec.site(self.ring[-1]).index)
        payloads, teachers = {}, {}
        for s in self.spec.sites:
            tensors, index = None, NO_TEACHER
            if phase == "personal" and common is not None:
                tensors, index = common, source
            elif phase == "common" and self.teacher_of(s.name) in models:
                pred = self.teacher_of(s.name)
                tensors, index = models[pred], float(self.spec.site(pred).index)
            payloads[s.name] = Payload(dict(tensors or {}), metrics={"teacher": index})
            teachers[s.name] = index
        new = {"models": models, "common": common, "common_from": source}
        return ServerResult(payloads, new, {"phase": phase, "teachers": teachers})

    # -- client --------------------------------------------------------------------------
    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        state = super().init_client(model, site)
        parts = self.parts(model)
        state.update(own=ResolvedPartition.take(model.state_dict(), parts.upload), flag=False)
        return state

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The site's own model (its weights and BN), not the teacher in the payload."""
        self.load(ctx.model, Payload(state["own"]), state)
        return ctx.model

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        cfg, model = self.config, ctx.model
        phase = self.phase(ctx.round, ctx.train.rounds)
        self.load(model, Payload(state["own"]), state)
        # validation data scores the flags and the personalization weight; without a
        # validation split, one training batch stands in (the same one for all scores)
        val = ctx.val if ctx.val is not None else next(ctx.batches)
        teacher_index = int(payload.metrics.get("teacher", NO_TEACHER))
        flag = bool(state["flag"])
        info = {"teacher": float(teacher_index), "copied": 0.0, "lam": 0.0}
        if phase == "init" or teacher_index < 0:
            metrics = train_steps(model, ctx)
        elif flag:
            # the teacher: its weights with this site's BN (BN never travels), frozen
            teacher = teacher_mode(copy.deepcopy(model))
            teacher.load_state_dict(payload.tensors, strict=False)
            lam = cfg.lam
            if phase == "personal":
                v1, v2 = self._score(model, val), labeled_dice(teacher, *val, self.spec)
                lam = personal_lambda(v1, v2, cfg.lam, cfg.thes)
            info["lam"] = lam
            net, loss = self.distillation(model, teacher, ctx, lam)
            metrics = train_steps(net, ctx, loss, params=list(model.parameters()))
        else:
            if phase == "common" or ctx.round == ctx.train.rounds - cfg.personal_rounds:
                model.load_state_dict(payload.tensors, strict=False)  # copy (keeps own BN)
                info["copied"] = 1.0
            metrics = train_steps(model, ctx)
        score = self._score(model, val)
        upload, private = self.split(model)
        private.update(
            own={k: v.clone() for k, v in upload.items()}, flag=flag or score > cfg.threshold
        )
        metrics.update(info, val_dice=score, flag=float(private["flag"]))
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def distillation(
        self, student: nn.Module, teacher: nn.Module, ctx: ClientContext, lam: float
    ) -> tuple[nn.Module, LossFn]:
        """``(module, loss)`` for :func:`train_steps`: ``seg + lam * MSE`` between the
        student's and the teacher's last decoder features (the student gets the gradient)."""
        seg = segmentation_loss(ctx)

        def loss(out: tuple[torch.Tensor, ...], labels: torch.Tensor) -> torch.Tensor:
            logits, feat, target = out
            return seg(logits, labels) + lam * F.mse_loss(feat, target)

        return _Distill(student, teacher), loss  # type: ignore[return-value]

    def _score(self, model: nn.Module, val: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Validation Dice of a student (evaluated in eval mode)."""
        model.eval()
        return labeled_dice(model, *val, self.spec)
