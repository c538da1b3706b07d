"""FedICRA (Lin et al., MLMI 2023): site prompt, multi-level tree energy, adaptive aggregation."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field
from torch import nn

from fedseg.losses_weak import GatedCRFLoss, TreeEnergyLoss, minmax_per_sample
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.ala import LAResult, init_weights, train_weights_by_pass
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
)
from fedseg.methods.fedlc import PCSMethod, contrast_loss
from fedseg.methods.fedrep import heads
from fedseg.methods.partition import Partition
from fedseg.methods.registry import register_method
from fedseg.methods.training import LossFn, segmentation_loss
from fedseg.models.fedicra_net import FedICRANet, ICRAOutput

__all__ = ["FedICRA", "ala_decoder_keys"]


def ala_decoder_keys(model: nn.Module) -> list[str]:
    """The parameters FedICRA aggregates adaptively: the decoder (up blocks and head,
    BN affine included); the auxiliary heads are not part of it."""
    return [k for k, p in model.named_parameters() if k.startswith("decoder.") and p.requires_grad]


class _Objective(nn.Module):
    """A training pass for one site: every output plus the contrastive term."""

    def __init__(self, net: FedICRANet, site: int) -> None:
        super().__init__()
        self.net, self.site = net, site

    def forward(self, x: torch.Tensor) -> tuple[ICRAOutput, torch.Tensor, torch.Tensor]:
        out = self.net.run(x, self.site)
        return out, contrast_loss(self.net.pcs, out.hmap, out.bottleneck.detach(), self.site), x


class _CRFAtScale:
    """The gated CRF loss with its window and spatial bandwidth given in pixels of an image of
    side ``ref`` and scaled to the side of the images it sees (unscaled when ``ref`` is None)."""

    def __init__(self, radius: int, xy: float, ref: int | None) -> None:
        self.radius, self.xy, self.ref = radius, xy, ref
        self._cache: dict[int, GatedCRFLoss] = {}

    def kernel(self, side: int) -> tuple[int, float]:
        """(radius, sigma_xy) for images of side ``side``."""
        if self.ref is None:
            return self.radius, self.xy
        k = side / self.ref
        return max(1, round(self.radius * k)), self.xy * k

    def __call__(self, probs: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        side = max(probs.shape[-2:])
        if side not in self._cache:
            radius, xy = self.kernel(side)
            self._cache[side] = GatedCRFLoss(radius=radius, sigma_xy=xy)
        return self._cache[side](probs, image)


@register_method("fedicra")
class FedICRA(PCSMethod):
    """Each site's one-hot prompt drives a channel selection on the encoder (private); the
    local loss is ``pCE + tree_weight * tree energy (image tree, then the trees of the three
    auxiliary heads in turn) + crf_weight * gated CRF + alpha * L_con``. A round first trains
    the head alone (``local_iters - body_iters`` iterations), then the rest with the head
    frozen. The server averages everything but the channel selection by sample count; each
    site starts a round from an element-wise, learned blend of its previous decoder and the
    global one (adaptive aggregation, ``fedseg.methods.ala``), the rest from the global model.

    Reference: Lin et al., "Unifying and Personalizing Weakly-supervised Federated Medical
    Image Segmentation via Adaptive Representation and Aggregation", MLMI 2023.
    """

    class Config(MethodConfig):
        """FedICRA settings."""

        alpha: float = Field(1.0, ge=0)
        """Weight of the contrastive site-prompt loss (1 in the authors' command)."""
        tree_weight: float = Field(0.1, ge=0)
        """Weight of the multi-level tree energy loss."""
        tree_sigma: float = Field(0.02, gt=0)
        """Bandwidth of the image tree's affinities (images rescaled to [0, 1])."""
        crf_weight: float = Field(0.1, ge=0)
        """Weight of the gated CRF loss (kernel: xy 6, rgb 0.1, radius 5)."""
        crf_radius: int = Field(5, ge=1)
        """Window radius of the gated CRF loss, in pixels (of ``crf_ref_size`` if set)."""
        crf_xy: float = Field(6.0, gt=0)
        """Spatial bandwidth of the gated CRF kernel, in pixels (of ``crf_ref_size`` if set)."""
        crf_ref_size: int | None = Field(256, ge=1)
        """Image side the CRF window and bandwidth are given for (default 256, the paper's
        images); they are scaled to the training images' side. None: used literally."""
        body_iters: int = Field(3, ge=0)
        """Last local iterations that train everything but the head (the others train the
        head only; FedICRA's rep_iters)."""
        aux_hidden: int = Field(512, ge=1)
        """Hidden channels of each auxiliary head (512 in FedICRA)."""
        pcs_shared: bool = False
        """Average the channel selection like the other weights instead of keeping it local."""
        eta: float = Field(1.0, gt=0)
        """Learning rate of the adaptive-aggregation weights."""
        ala_threshold: float = Field(0.1, gt=0)
        """First adaptive aggregation: passes until the std of the last losses is below."""
        ala_window: int = Field(10, ge=1)
        """Number of pass losses in that convergence test."""
        ala_max_passes: int = Field(50, ge=1)
        """Cap on the first adaptive aggregation's passes over the local data."""

    config: Config
    partition = Partition(private=("pcs.*",))
    personalized = True
    summary = "FedICRA: one-hot site prompt + channel selection, tree-energy/CRF losses, ALA"

    def build_model(self) -> nn.Module:
        self._check_2d()
        s = self.spec
        return FedICRANet(
            s.in_channels,
            s.num_classes,
            len(s.sites),
            aux_hidden=self.config.aux_hidden,
            **self.unet_kwargs(),
        )

    # -- server --------------------------------------------------------------------------
    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        payload = Payload(weighted_average(uploads))
        return ServerResult({s.name: payload for s in ctx.spec.sites}, state)

    # -- client --------------------------------------------------------------------------
    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        state = super().init_client(model, site)
        sd = model.state_dict()
        keys = ala_decoder_keys(model)
        state.update(
            ala_prev={k: sd[k].detach().clone() for k in keys},
            ala=init_weights(sd, keys),
            ala_started=False,
        )
        return state

    def adapt(self, payload: Payload, state: State, ctx: ClientContext) -> LAResult:
        """Load the global model and blend the decoder with the site's previous one
        (trains the aggregation weights on one pass over the local data)."""
        net, cfg = ctx.model, self.config
        self.load(net, payload, state)
        net.site = ctx.site.index
        per_pass = max(1, ctx.site.num_train // min(ctx.train.batch_size, ctx.site.num_train))
        seg = segmentation_loss(ctx)
        first = not state["ala_started"]
        return train_weights_by_pass(
            net,
            state["ala_prev"],
            payload.tensors,
            state["ala"],
            ctx.batches,
            lambda m, x, y: seg(m(x), y),
            per_pass=per_pass,
            first=first,
            max_passes=cfg.ala_max_passes,
            eta=cfg.eta,
            window=cfg.ala_window,
            tol=cfg.ala_threshold,
        )

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        net = ctx.model
        ala = self.adapt(payload, state, ctx)
        head = set(heads(net))
        metrics = self.train_phases(
            _Objective(net, ctx.site.index),
            self._loss(ctx),
            ctx,
            ("head", head),
            ("body", {n for n, _ in net.named_parameters()} - head),
        )
        metrics.update(
            ala_steps=float(ala.steps),
            ala_w_mean=sum(float(w.mean()) for w in ala.weights.values()) / len(ala.weights),
        )
        upload, private = self.split(net)
        sd = net.state_dict()
        private.update(
            ala_prev={k: sd[k].detach().clone() for k in state["ala_prev"]},
            ala=ala.weights,
            ala_started=state["ala_started"] or not ala.skipped,
        )
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)

    def _loss(self, ctx: ClientContext) -> LossFn:
        cfg, spec = self.config, ctx.spec
        seg = segmentation_loss(ctx)
        tree = TreeEnergyLoss(cfg.tree_sigma)
        crf = _CRFAtScale(cfg.crf_radius, cfg.crf_xy, cfg.crf_ref_size)

        def loss(
            out: tuple[ICRAOutput, torch.Tensor, torch.Tensor], labels: torch.Tensor
        ) -> torch.Tensor:
            res, contrast, images = out
            value = seg(res.logits, labels) + cfg.alpha * contrast
            guide = minmax_per_sample(images)
            if cfg.tree_weight:
                low = guide.repeat(1, 3, 1, 1) if guide.shape[1] == 1 else guide
                unlabeled = labels == spec.ignore_index
                value = value + cfg.tree_weight * tree(res.logits, low, unlabeled, res.aux)
            if cfg.crf_weight:
                value = value + cfg.crf_weight * crf(torch.softmax(res.logits, 1), guide)
            return value

        return loss  # type: ignore[return-value]

    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        """The site's adaptively aggregated model for the latest global model, with its own
        prompt (the learned weights are not stored)."""
        self.adapt(payload, state, ctx)
        return ctx.model
