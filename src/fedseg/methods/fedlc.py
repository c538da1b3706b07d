"""FedLC / LC-Fed (Wang, Jin, Wang, ECCV 2022): personalization by local calibration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    Method,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
)
from fedseg.methods.fedrep import HEADS, heads, trainable_only
from fedseg.methods.partition import Partition, ResolvedPartition
from fedseg.methods.registry import register_method
from fedseg.methods.training import LossFn, segmentation_loss, train_steps
from fedseg.models.fedlc_net import ChannelSelection, FedLCNet, HeadWeights, LCOutput

__all__ = ["FedLC", "PCSMethod", "contrast_loss", "peer_heads"]

PEER = "peer_head"
"""Prefix of the extra payload tensors carrying every site's head: ``peer_head.<i>.weight``."""


def contrast_loss(
    pcs: ChannelSelection, own: torch.Tensor, x: torch.Tensor, site: int
) -> torch.Tensor:
    """Contrastive site-embedding loss ``-1/(K-1) sum_{j != site} MSE(own, hmap_j)``.

    ``hmap_j`` is the channel attention of every other site's embedding on the same
    bottleneck ``x``, without gradient; ``own`` is the site's attention. Zero for one site.
    """
    others = [j for j in range(pcs.num_sites) if j != site]
    if not others:
        return own.sum() * 0.0
    with torch.no_grad():
        refs = [pcs.attention(x, j) for j in others]
    return -sum(F.mse_loss(own, r) for r in refs) / len(others)  # type: ignore[return-value]


def peer_heads(payload: Payload, num_sites: int, device: torch.device) -> list[HeadWeights]:
    """Every site's head (in site order) from a FedLC payload, on ``device``."""
    t = payload.tensors
    try:
        return [
            (t[f"{PEER}.{i}.weight"].to(device), t[f"{PEER}.{i}.bias"].to(device))
            for i in range(num_sites)
        ]
    except KeyError as err:
        raise ConfigError(f"FedLC payload lacks peer head tensor {err}") from None


class PCSMethod(Method):
    """Shared base of FedLC and FedICRA: a network with a channel selection ``pcs``
    (private unless the config's ``pcs_shared`` is true, then averaged like the body) and a
    round (``train.local_iters`` steps, or ``local_epochs`` passes) split into two training
    phases (by the config's ``body_iters`` unless :meth:`phase_steps` is overridden)."""

    def parts(self, model: nn.Module) -> ResolvedPartition:
        if self._parts is None:
            part = self.partition
            if getattr(self.config, "pcs_shared", False):
                private = tuple(s for s in part.private if s != "pcs.*")
                part = Partition(part.shared, part.download_only, private)
            self._parts = part.resolve(model)
        return self._parts

    def _check_2d(self) -> None:
        if self.spec.ndim != 2:
            raise ConfigError(
                f"method {type(self).__name__}: needs 2D images (spec.ndim 2), got {self.spec.ndim}"
            )

    def phase_steps(self, ctx: ClientContext) -> tuple[int, int]:
        """Steps of the two phases of a round: the round's steps (:meth:`ClientContext.steps`)
        less the config's ``body_iters``, then ``body_iters``."""
        total, body_iters = ctx.steps(), self.config.body_iters  # type: ignore[attr-defined]
        if body_iters > total:
            raise ConfigError(
                f"method.body_iters must be <= the round's steps ({total}), got {body_iters}"
            )
        return total - body_iters, body_iters

    def train_phases(
        self,
        objective: nn.Module,
        loss: LossFn,
        ctx: ClientContext,
        first: tuple[str, set[str]],
        second: tuple[str, set[str]],
    ) -> dict[str, float]:
        """Train only the parameters named in ``first``, then those in ``second``, for the
        steps :meth:`phase_steps` gives (``loss_<phase>`` each; ``loss`` is the last
        phase's)."""
        metrics: dict[str, float] = {}
        for (phase, names), iters in zip((first, second), self.phase_steps(ctx), strict=True):
            if iters == 0:
                continue
            with trainable_only(ctx.model, names) as params:
                metrics[f"loss_{phase}"] = train_steps(objective, ctx, loss, params, iters)["loss"]
        metrics["loss"] = metrics.get(f"loss_{second[0]}", metrics.get(f"loss_{first[0]}", 0.0))
        return metrics


class _Objective(nn.Module):
    """One training pass of LC-Fed: main logits, contrastive term, calibrated logits."""

    def __init__(self, net: FedLCNet, site: int, peers: list[HeadWeights] | None) -> None:
        super().__init__()
        self.net, self.site, self.peers = net, site, peers

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        out: LCOutput = self.net.run(x, self.site)
        bottleneck = out.bottleneck.detach()
        own = self.net.pcs.attention(bottleneck, self.site)
        contrast = contrast_loss(self.net.pcs, own, bottleneck, self.site)
        calibrated = None if self.peers is None else self.net.calibrated(out, self.site, self.peers)
        return out.logits, contrast, calibrated


@register_method("fedlc")
class FedLC(PCSMethod):
    """LC-Fed: shared UNet body; each site keeps its channel selection (one-hot site
    embedding at the bottleneck) and head calibration, and its own segmentation head, which
    the server forwards to every site (heads are never averaged).

    Each local iteration minimises ``seg(main) + alpha * L_c + seg(calibrated)``: ``L_c``
    pushes the site's channel attention away from the other embeddings' (it trains the
    channel selection only), the calibrated prediction trains only the calibration head
    (features detached). A round makes the run's steps (``train.local_iters``, or
    ``local_epochs`` passes over the site's data); its first ``personal_iters`` steps (default:
    ``personal_fraction`` of them) update only the personal parts (head, channel selection,
    calibration), the rest update everything. The server averages the body by sample count.

    Reference: Wang, Jin, Wang, "Personalizing Federated Medical Image Segmentation via Local
    Calibration", ECCV 2022.
    """

    class Config(MethodConfig):
        """FedLC settings."""

        replaces: ClassVar[dict[str, str]] = {"personal_iters": "personal_fraction"}

        alpha: float = Field(0.1, ge=0)
        """Weight of the contrastive site-embedding loss L_c (0.1 in the FedLPPA comparison)."""
        personal_iters: int | None = Field(None, ge=0)
        """Steps at the start of a round that train only the personal parts (LC-Fed's
        ``head_iter``, 10 batches of each epoch); a shorter round trains only them. Default:
        ``personal_fraction`` of the round's steps."""
        personal_fraction: float = Field(0.2, ge=0, le=1)
        """Share of a round's steps (rounded) that train only the personal parts; 0.2 is
        LC-Fed's 10 of the ~53 batches per epoch of its large fundus sites."""
        calibration: bool = True
        """Train the head calibration and evaluate with its output (LC-Fed's ``hc``)."""
        pcs_shared: bool = False
        """Average the channel selection like the body instead of keeping it private."""
        hc_kernel: int = Field(31, ge=1)
        """Window of the disagreement non-maximum suppression and of the Gaussian."""
        hc_sigma: float = Field(6.0, gt=0)
        """Sigma of the Gaussian that blurs peaks and prediction."""
        hc_threshold: float = Field(0.2, ge=0, le=1)
        """Minimum normalised disagreement of a peak."""

    config: Config
    partition = Partition(private=("pcs.*", "hc.*"))
    personalized = True
    summary = "FedLC: local calibration (private channel selection + head calibration), local heads"

    def build_model(self) -> nn.Module:
        self._check_2d()
        s, c = self.spec, self.config
        return FedLCNet(
            s.in_channels,
            s.num_classes,
            len(s.sites),
            hc_kernel=c.hc_kernel,
            hc_sigma=c.hc_sigma,
            hc_threshold=c.hc_threshold,
            **self.unet_kwargs(),
        )

    def phase_steps(self, ctx: ClientContext) -> tuple[int, int]:
        """Personal-only steps, then steps training everything; together the round's steps."""
        total, cfg = ctx.steps(), self.config
        personal = cfg.personal_iters
        if personal is None:
            personal = round(cfg.personal_fraction * total)
        personal = min(personal, total)
        return personal, total - personal

    def download_template(self, model: nn.Module) -> Template:
        """The partition's download plus every site's head as ``peer_head.<i>.*``."""
        out = super().download_template(model)
        own = {k.rsplit(".", 1)[1]: v for k, v in out.items() if k.startswith(HEADS)}
        for s in self.spec.sites:
            for part, spec in own.items():
                out[f"{PEER}.{s.index}.{part}"] = spec
        return out

    # -- server --------------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        sd = model.state_dict()
        glob = ResolvedPartition.take(sd, self.parts(model).download)
        head = {k: v for k, v in glob.items() if k.startswith(HEADS)}
        state = {"heads": {s.name: dict(head) for s in self.spec.sites}}
        return ServerResult(self._payloads(glob, state["heads"]), state)

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        first = next(iter(uploads.values())).tensors
        body = [k for k in first if not k.startswith(HEADS)]
        own = {
            s: {k: v for k, v in u.tensors.items() if k.startswith(HEADS)}
            for s, u in uploads.items()
        }
        site_heads = {**state["heads"], **own}
        glob = weighted_average(uploads, keys=body)
        return ServerResult(self._payloads(glob, site_heads), {"heads": site_heads})

    def _payloads(
        self, body: dict[str, torch.Tensor], site_heads: Mapping[str, Mapping[str, torch.Tensor]]
    ) -> dict[str, Payload]:
        """Per site: the averaged body, its own head, and every site's head as peers."""
        peers = {}
        for s in self.spec.sites:
            for k, v in site_heads[s.name].items():
                peers[f"{PEER}.{s.index}.{k.rsplit('.', 1)[1]}"] = v
        return {s.name: Payload({**body, **site_heads[s.name], **peers}) for s in self.spec.sites}

    # -- client --------------------------------------------------------------------------
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        net, site = ctx.model, ctx.site.index
        self.load(net, payload, state)
        peers = (
            peer_heads(payload, len(self.spec.sites), ctx.device)
            if self.config.calibration
            else None
        )
        personal = set(self.parts(net).private) | set(heads(net))
        everything = {n for n, _ in net.named_parameters()}
        metrics = self.train_phases(
            _Objective(net, site, peers),
            self._loss(ctx),
            ctx,
            ("personal", personal),
            ("all", everything),
        )
        upload, private = self.split(net)
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def _loss(self, ctx: ClientContext) -> LossFn:
        seg, alpha = segmentation_loss(ctx), self.config.alpha

        def loss(out: tuple[torch.Tensor, ...], labels: torch.Tensor) -> torch.Tensor:
            logits, contrast, calibrated = out
            value = seg(logits, labels) + alpha * contrast
            return value if calibrated is None else value + seg(calibrated, labels)

        return loss  # type: ignore[return-value]

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The site's model with its embedding; calibrated output when ``calibration``."""
        net = ctx.model
        self.load(net, payload, state)
        net.site = ctx.site.index
        net.calibrate = self.config.calibration
        net.peer_heads = (
            peer_heads(payload, len(self.spec.sites), ctx.device) if net.calibrate else None
        )
        return net
