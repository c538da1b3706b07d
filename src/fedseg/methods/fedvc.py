"""Virtual classes + personalized affinity aggregation (Liu, Fang, Wu, Qin, "Personalized
Federated Medical Image Segmentation via Virtual Classes", TMI submission 2024).

Decisions the paper leaves open are listed in docs/methods/fedvc.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from torch import nn

from fedseg.errors import ConfigError
from fedseg.losses import PartialCrossEntropy, SoftDiceLoss
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    FederationSpec,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.methods.registry import register_method
from fedseg.methods.training import train_steps
from fedseg.models.fpn import PVTv2FPNConfig
from fedseg.models.paa import PAA_PARTS
from fedseg.models.registry import ModelConfig
from fedseg.models.unet import UNetConfig
from fedseg.models.vc_net import PAAUNet, attach_virtual_head

__all__ = ["FedVC", "pseudo_labels", "virtual_class_loss", "virtual_usage"]

PAAPart = Literal["query", "key", "modulation"]
VIRTUAL_KEY = "decoder.head.virtual"


def pseudo_labels(
    virtual: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    mode: Literal["all", "per_class"],
    ignore_index: int,
) -> torch.Tensor:
    """Virtual-class targets (indices into the ``C + V`` logits) of every pixel.

    ``all``: the most similar of all ``V`` virtual classes (Eq. 5, every pixel). ``per_class``:
    the most similar of the ``V / C`` virtual classes of the pixel's real class (block
    ``c * V/C ... (c+1) * V/C - 1``); unlabeled pixels get ``ignore_index``.
    """
    with torch.no_grad():
        if mode == "all":
            return num_classes + virtual.argmax(1)
        per = virtual.shape[1] // num_classes
        valid = labels != ignore_index
        lab = torch.where(valid, labels, torch.zeros_like(labels)).long()
        best = virtual.unflatten(1, (num_classes, per)).argmax(2)
        pick = best.gather(1, lab.unsqueeze(1)).squeeze(1)
        target = num_classes + lab * per + pick
        return torch.where(valid, target, torch.full_like(target, ignore_index))


def virtual_class_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    ignore_index: int,
    lambda_r: float = 1.0,
    lambda_v: float = 1.0,
    pseudo_label: Literal["all", "per_class"] = "per_class",
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 8: ``L_dice + lambda_r * L_r + lambda_v * L_v`` and its terms.

    ``L_dice`` and ``L_r`` (cross-entropy, Eq. 4) use the ``C`` real logits. ``L_v`` (Eq. 5) is
    the cross-entropy of the masked logits (Eqs. 6-7: the real logits replaced by 0, so no
    gradient reaches them) against the pseudo-labels of :func:`pseudo_labels`. Without virtual
    channels ``L_v`` is 0. ``counts`` (``C x V``), if given, is incremented by the labelled
    pixels per (real class, pseudo-label row): the input of :func:`virtual_usage`.
    """
    real = logits[:, :num_classes]
    dice = SoftDiceLoss(num_classes, ignore_index=ignore_index)(real, labels)
    ce = PartialCrossEntropy(ignore_index)(real, labels)
    virtual = logits[:, num_classes:]
    lv = logits.new_zeros(())
    if virtual.shape[1]:
        target = pseudo_labels(virtual.detach(), labels, num_classes, pseudo_label, ignore_index)
        masked = torch.cat([torch.zeros_like(real), virtual], dim=1)
        per_pixel = F.cross_entropy(masked, target, ignore_index=ignore_index, reduction="none")
        valid = (target != ignore_index).sum()
        lv = per_pixel.sum() / valid.clamp(min=1)
        if counts is not None:
            counts += _row_counts(target, labels, num_classes, virtual.shape[1], ignore_index)
    total = dice + lambda_r * ce + lambda_v * lv
    return total, {"dice": dice.detach(), "ce": ce.detach(), "virtual": lv.detach()}


def _row_counts(
    target: torch.Tensor, labels: torch.Tensor, num_classes: int, num_virtual: int, ignore: int
) -> torch.Tensor:
    """Labelled pixels per (real class, virtual row) of ``target`` (``C x V``)."""
    keep = (labels != ignore) & (target != ignore)
    pair = labels[keep].long() * num_virtual + (target[keep] - num_classes)
    return torch.bincount(pair, minlength=num_classes * num_virtual).view(num_classes, -1)


def virtual_usage(counts: torch.Tensor, min_share: float = 0.01) -> dict[str, float]:
    """Utilisation of the virtual rows from ``C x V`` pixel counts (:func:`virtual_class_loss`).

    Per real class ``c`` with pixels: ``vc_rows_c<c>``, the rows holding at least
    ``min_share`` of them; ``vc_entropy_c<c>``, the entropy (bits) of their distribution
    over the rows; ``vc_shared_c<c>``, the share of them on rows where another class has more
    pixels. ``vc_shared``: the same share over all counted pixels (0 when every row serves
    one class).
    """
    counts = counts.double()
    lost = counts.max(0).values != counts  # (class, row): another class holds the row
    out: dict[str, float] = {}
    for c, row in enumerate(counts):
        if row.sum() == 0:
            continue
        p = row / row.sum()
        out[f"vc_rows_c{c}"] = float((p >= min_share).sum())
        out[f"vc_entropy_c{c}"] = float(-(p[p > 0] * p[p > 0].log2()).sum())
        out[f"vc_shared_c{c}"] = float(p[lost[c]].sum())
    if counts.sum() > 0:
        out["vc_shared"] = float(1 - counts.max(0).values.sum() / counts.sum())
    return out


@register_method("fedvc")
class FedVC(FedAvg):
    """Each site trains a network whose cosine head holds ``C`` real classes and ``V`` frozen,
    mutually orthogonal virtual classes (``L_dice + lambda_r L_r + lambda_v L_v``), with
    affinity aggregation in the decoder whose query and modulation stay on the site; the
    server averages everything else (the affinity keys included) by sample count. The
    virtual rows never change and never travel.

    ``vc: false`` / ``paa: false`` give Table II's ablations; ``paa_shared`` Table III and
    Fig. 8 (e)-(f); ``virtual_factor`` Fig. 8 (c)-(d); ``lambda_v`` Fig. 8 (g)-(h); the
    backbone is the ``model:`` block (``unet``, or ``pvtv2_fpn`` for "Ours†").
    """

    class Config(MethodConfig):
        """Virtual-class and PAA settings."""

        replaces: ClassVar[dict[str, str]] = {"virtual_classes": "virtual_factor"}

        vc: bool = True
        """Virtual-class cosine head and ``L_v`` (false: the backbone's conv head, Dice+CE)."""
        virtual_classes: PositiveInt | None = None
        """Number of virtual classes V (default ``virtual_factor * C * N``)."""
        virtual_factor: PositiveFloat = 1.0
        """V in units of C*N (C real classes incl. background, N sites); Fig. 8: 1/4 ... 4.
        With ``per_class`` the rows per class, ``virtual_factor * N``, are rounded."""
        scale: PositiveFloat = 10.0
        """Logit scale s: logits are s * cosine similarity."""
        lambda_r: float = Field(1.0, ge=0)
        """Weight of the real-class cross-entropy L_r."""
        lambda_v: float = Field(1.0, ge=0)
        """Weight of the virtual-class loss L_v."""
        pseudo_label: Literal["all", "per_class"] = "per_class"
        """Pseudo-label over the V/C virtual classes of the pixel's real class (``per_class``,
        the paper's several virtual classes per real class; V must be a multiple of C) or
        over ``all`` V (Eq. 5 literally)."""
        paa: bool = True
        """Personalized affinity aggregation in the decoder."""
        paa_shared: tuple[PAAPart, ...] = ("key",)
        """PAA projections averaged by the server; the others stay on the site (Eqs. 13-15:
        the key only; Table III's non-personalized row: all three)."""
        average: Literal["samples", "uniform"] = "samples"
        """Weights of the server average: sample counts (FedAvg) or 1/N (Eq. 15 literally)."""

        @model_validator(mode="after")
        def _check(self) -> FedVC.Config:
            if len(set(self.paa_shared)) != len(self.paa_shared):
                raise ValueError(f"paa_shared lists a part twice: {list(self.paa_shared)}")
            return self

    config: Config
    personalized = True
    summary = (
        "Virtual classes (frozen orthogonal cosine-head rows, pseudo-labelled L_v) + PAA "
        "(query/modulation personal, key averaged)"
    )

    def __init__(
        self, config: Config, spec: FederationSpec, model: ModelConfig | None = None
    ) -> None:
        super().__init__(config, spec, model)
        if not isinstance(self.model_cfg, UNetConfig | PVTv2FPNConfig):
            raise ConfigError(
                f"model.name: fedvc needs unet or pvtv2_fpn, got {self.model_cfg.name!r}"
            )
        self.num_virtual = self._num_virtual() if config.vc else 0
        c = spec.num_classes
        if config.vc and config.pseudo_label == "per_class" and self.num_virtual % c:
            raise ConfigError(
                f"method.pseudo_label: per_class needs V a multiple of C={c}, "
                f"got V={self.num_virtual}"
            )

    def _num_virtual(self) -> int:
        cfg, spec = self.config, self.spec
        if cfg.virtual_classes is not None:
            return cfg.virtual_classes
        c, n = spec.num_classes, len(spec.sites)
        if cfg.pseudo_label == "per_class":
            return c * max(1, round(cfg.virtual_factor * n))
        return max(1, round(cfg.virtual_factor * c * n))

    # -- network and partition -------------------------------------------------------------
    def build_model(self) -> nn.Module:
        cfg, s = self.config, self.spec
        if isinstance(self.model_cfg, PVTv2FPNConfig):
            net: nn.Module = self.model_cfg.build(s.in_channels, s.num_classes, s.ndim, paa=cfg.paa)
        else:
            net = PAAUNet(s.in_channels, s.num_classes, s.ndim, **self.unet_kwargs(), paa=cfg.paa)
        if cfg.vc:
            attach_virtual_head(net, s.num_classes, self.num_virtual, cfg.scale, s.ndim)
        return net

    def parts(self, model: nn.Module) -> ResolvedPartition:
        if self._parts is None:
            cfg = self.config
            private = [VIRTUAL_KEY] if cfg.vc else []
            if cfg.paa:
                private += [f"paa.*.{p}.*" for p in PAA_PARTS if p not in cfg.paa_shared]
            self._parts = Partition(private=tuple(private)).resolve(model)
        return self._parts

    # -- local training, aggregation, prediction --------------------------------------------
    def train_round(self, payload: Payload, ctx: ClientContext) -> dict[str, float]:
        cfg, spec = self.config, ctx.spec
        terms: dict[str, float] = {"dice": 0.0, "ce": 0.0, "virtual": 0.0}
        counts = torch.zeros(
            spec.num_classes, self.num_virtual, dtype=torch.long, device=ctx.device
        )

        def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            total, parts = virtual_class_loss(
                logits,
                labels,
                num_classes=spec.num_classes,
                ignore_index=spec.ignore_index,
                lambda_r=cfg.lambda_r,
                lambda_v=cfg.lambda_v,
                pseudo_label=cfg.pseudo_label,
                counts=counts,
            )
            for k, v in parts.items():
                terms[k] += float(v)
            return total

        out = train_steps(ctx.model, ctx, loss)
        n = max(ctx.steps(), 1)
        return out | {f"loss_{k}": v / n for k, v in terms.items()} | virtual_usage(counts)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        weights = None
        if self.config.average == "uniform":
            weights = {s: 1.0 / len(uploads) for s in uploads}
        payload = Payload(weighted_average(uploads, weights))
        return ServerResult({s.name: payload for s in ctx.spec.sites}, state)

    def segment(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Arg-max over the real classes only (the virtual channels are not labels)."""
        return model(images)[:, : self.spec.num_classes].argmax(1)
