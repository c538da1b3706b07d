"""MOON (Li, He and Song, CVPR 2021): model-contrastive federated learning.

Each site keeps the model it ended its previous round with (privately); local training adds
``mu * L_con``, a two-way contrast that pulls the projected representation of the local
model towards that of the received global model and pushes it from that of the previous
local model. The server is FedAvg.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from torch import nn

from fedseg.methods.alignment import (
    AlignmentConfig,
    AlignmentMethod,
    feature_dim,
    pixel_rows,
    random_pixels,
    train_with_terms,
)
from fedseg.methods.base import ClientContext, ClientResult, Payload, SiteSpec, State
from fedseg.methods.registry import register_method
from fedseg.models.features import named_features
from fedseg.models.layers import conv

__all__ = ["MOON", "ProjectedNet", "moon_contrastive"]


def moon_contrastive(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float
) -> torch.Tensor:
    """MOON's model-contrastive loss of representations ``[N, P]``: the mean over rows of
    ``-log(e^{cos(z, z_glob)/tau} / (e^{cos(z, z_glob)/tau} + e^{cos(z, z_prev)/tau}))``."""
    logits = torch.stack(
        [F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1
    )
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / tau, target)


class ProjectedNet(nn.Module):
    """A segmentation network plus MOON's projection head on its feature ``level``.

    ``forward`` is the network's (the head plays no part in segmentation); :meth:`project`
    also returns the projection: per pixel (``[B, P, *S]``) or, with ``pooled``, of the
    globally average-pooled feature (``[B, P, 1, ...]``).
    """

    def __init__(self, backbone: nn.Module, level: str, head: nn.Module, pooled: bool) -> None:
        super().__init__()
        self.backbone, self.projection = backbone, head
        self.level, self.pooled = level, pooled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, projection)`` of one forward pass."""
        logits, feats = named_features(self.backbone, x, [self.level])
        f = feats[self.level]
        if self.pooled:
            f = f.mean(dim=tuple(range(2, f.dim())), keepdim=True)
        return logits, self.projection(f)


class _MoonView(nn.Module):
    """Training view: ``x -> (logits, (z, z_glob, z_prev))``; the frozen global and previous
    models stay in eval mode and get no gradient."""

    def __init__(self, net: ProjectedNet, glob: ProjectedNet, prev: ProjectedNet) -> None:
        super().__init__()
        self.net = net
        self.frozen = nn.ModuleList([glob, prev]).requires_grad_(False)

    def train(self, mode: bool = True) -> _MoonView:
        super().train(mode)
        self.frozen.eval()
        return self

    def forward(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits, z = self.net.project(x)
        with torch.no_grad():
            z_glob = self.frozen[0].project(x)[1]
            z_prev = self.frozen[1].project(x)[1]
        return logits, (z, z_glob, z_prev)


@register_method("moon")
class MOON(AlignmentMethod):
    """FedAvg plus MOON's model-contrastive term on a projection of pixel features.

    Reference: Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021.
    """

    class Config(AlignmentConfig):
        """MOON settings (see docs/methods/moon.md)."""

        mu: float = Field(5.0, ge=0)
        """Weight of the contrastive term (paper: 5 on CIFAR-10, 1 on CIFAR-100/Tiny-ImageNet;
        RethinkFL, the framework FedBCS builds on: 5)."""
        tau: PositiveFloat = 0.5
        """Temperature of the cosine similarities (paper: 0.5)."""
        representation: Literal["pixel", "image"] = "pixel"
        """``pixel``: contrast per pixel of ``level`` (1x1-conv head); ``image``: contrast the
        globally average-pooled ``level`` feature per image (the classification form)."""
        proj_dim: PositiveInt | None = None
        """Output width of the projection head (default: the feature's width)."""

    config: Config
    summary = "MOON: FedAvg + model-contrastive loss (global vs previous local model)"

    def build_model(self) -> nn.Module:
        backbone = super().build_model()
        cfg, nd = self.config, self.spec.ndim
        dim = feature_dim(backbone, self.spec, cfg.level)
        out = cfg.proj_dim or dim
        head = nn.Sequential(conv(nd, dim, dim, kernel_size=1), nn.ReLU(), conv(nd, dim, out, 1))
        return ProjectedNet(backbone, cfg.level, head, cfg.representation == "image")

    def init_client(self, model: nn.Module, site: SiteSpec) -> State:
        """No private weights; the previous local model starts as the initial model (as in
        MOON's code, so round 1's positive and negative coincide)."""
        state = super().init_client(model, site)
        state["prev"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return state

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        model = ctx.model
        self.load(model, payload, state)
        glob = copy.deepcopy(model)
        prev = copy.deepcopy(model)
        prev.load_state_dict(state["prev"])
        cfg = self.config

        def terms(
            logits: torch.Tensor,
            reps: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
            labels: torch.Tensor,
        ) -> dict[str, torch.Tensor]:
            z, z_glob, z_prev = (pixel_rows(r) for r in reps)
            idx = random_pixels(len(z), cfg.pixels, ctx.generator, z.device)
            return {"con": cfg.mu * moon_contrastive(z[idx], z_glob[idx], z_prev[idx], cfg.tau)}

        metrics = train_with_terms(_MoonView(model, glob, prev), ctx, terms)  # type: ignore[arg-type]
        upload, private = self.split(model)
        private["prev"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return ClientResult(Payload(upload, num_examples=ctx.site.num_train), private, metrics)
