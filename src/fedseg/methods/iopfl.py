"""IOP-FL (Jiang, Yang, Cheng, Dou, TMI 2023): inside personalisation by local trajectories,
outside personalisation by test-time routing over the federation's models."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from fedseg.errors import ConfigError, UploadError
from fedseg.methods.aggregate import weighted_average
from fedseg.methods.base import (
    ClientContext,
    ClientResult,
    FederationSpec,
    MethodConfig,
    Payload,
    ServerContext,
    ServerResult,
    State,
    Template,
    TensorSpec,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.methods.feddp import per_site
from fedseg.methods.registry import register_method
from fedseg.methods.training import (
    autocast,
    backward_step,
    channels_last_model,
    grad_scaler,
    memory_format,
)
from fedseg.models.registry import ModelConfig

__all__ = [
    "IOPFL",
    "RoutedConv",
    "adaptation_loss",
    "routed_model",
    "update_trajectory",
]

EXPERT = "expert."
"""Prefix of the trajectories an unseen site receives: ``expert.<site index>.<key>``."""


def update_trajectory(
    traj: Mapping[str, torch.Tensor] | None, local: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """``alpha * traj + (1 - alpha) * local`` per float tensor (the local model itself when
    there is no trajectory yet; integer buffers take the local value)."""
    if traj is None:
        return {k: v.detach().clone() for k, v in local.items()}
    return {
        k: alpha * traj[k] + (1 - alpha) * v if v.is_floating_point() else v.clone()
        for k, v in local.items()
    }


class RoutedConv(nn.Module):
    """A convolution whose kernel (and bias) is a per-sample mixture of E expert kernels,
    ``sum_e r_e(x) W_e`` with ``r = sigmoid(fc2(dropout(fc1(GAP(x)))))`` (not normalised)."""

    def __init__(self, conv: nn.Conv2d | nn.Conv3d, experts: list[nn.Module], dropout: float):
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ConfigError(
                f"IOP-FL routing needs zero-padded convolutions, got {conv.padding_mode}"
            )
        self.conv = conv
        self.register_buffer("kernels", torch.stack([e.weight.detach() for e in experts]))
        biases = [e.bias.detach() for e in experts if e.bias is not None]
        self.register_buffer("biases", torch.stack(biases) if biases else None)
        c = conv.in_channels
        self.router = nn.Sequential(
            nn.Linear(c, 2 * c), nn.Dropout(dropout), nn.Linear(2 * c, len(experts))
        )

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        """Routing weights ``[N, E]`` of the samples of ``x``."""
        return torch.sigmoid(self.router(x.flatten(2).mean(2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, n = self.conv, x.shape[0]
        r = self.routing(x)
        kernels = torch.einsum("ne,e...->n...", r, self.kernels).flatten(0, 1)
        bias = (r @ self.biases).flatten() if self.biases is not None else None
        fn = F.conv2d if x.dim() == 4 else F.conv3d
        out = fn(
            x.reshape(1, -1, *x.shape[2:]),
            kernels,
            bias,
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.groups * n,
        )
        return out.reshape(n, -1, *out.shape[2:])


def routed_model(
    model: nn.Module, experts: list[Mapping[str, torch.Tensor]], dropout: float
) -> nn.Module:
    """A copy of ``model`` (holding the global weights) whose every convolution routes over
    the convolutions of ``experts`` (state dicts, e.g. the sites' trajectories and the global
    model). BatchNorm layers keep the global affine parameters and use batch statistics."""
    routed = copy.deepcopy(model)
    copies = []
    for sd in experts:
        m = copy.deepcopy(model)
        m.load_state_dict(sd)
        copies.append(dict(m.named_modules()))
    convs = [n for n, m in routed.named_modules() if isinstance(m, nn.Conv2d | nn.Conv3d)]
    for name in convs:
        parent, _, child = name.rpartition(".")
        owner = routed.get_submodule(parent) if parent else routed
        setattr(
            owner, child, RoutedConv(owner.get_submodule(child), [c[name] for c in copies], dropout)
        )
    for m in routed.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            m.running_mean = m.running_var = m.num_batches_tracked = None
    routed.requires_grad_(False)
    return routed


def _transform(x: torch.Tensor, gen: torch.Generator) -> tuple[list[int], list[bool]]:
    """Per-sample rotation (multiples of 90 degrees in the last two axes; 0/180 when they
    differ in size) and flip of the last axis, drawn from ``gen``."""
    square = x.shape[-1] == x.shape[-2]
    n = x.shape[0]
    rots = torch.randint(0, 4 if square else 2, (n,), generator=gen).tolist()
    return [k if square else 2 * k for k in rots], torch.randint(
        0, 2, (n,), generator=gen
    ).bool().tolist()


def _apply(x: torch.Tensor, rots: list[int], flips: list[bool], inverse: bool) -> torch.Tensor:
    dims = (x.dim() - 2, x.dim() - 1)
    out = []
    for xi, k, f in zip(x.unbind(0), rots, flips, strict=True):
        xi = xi.unsqueeze(0)
        if inverse:
            xi = torch.rot90(xi, -k, dims)
            xi = torch.flip(xi, (-1,)) if f else xi
        else:
            xi = torch.flip(xi, (-1,)) if f else xi
            xi = torch.rot90(xi, k, dims)
        out.append(xi)
    return torch.cat(out)


def adaptation_loss(
    model: nn.Module,
    x: torch.Tensor,
    gen: torch.Generator,
    *,
    noise_std: float,
    entropy_weight: float,
    consistency_weight: float,
) -> torch.Tensor:
    """IOP-FL's unsupervised test-time objective on unlabelled images ``x``:
    ``entropy_weight`` * normalised per-pixel entropy + ``consistency_weight`` * MSE between
    the softmax of the prediction and that of a noisy, rotated/flipped copy mapped back."""
    logits = model(x)
    p = logits.softmax(1)
    entropy = -(p * torch.log(p + 1e-6)).sum(1) / math.log(p.shape[1])
    rots, flips = _transform(x, gen)
    noisy = x + noise_std * torch.randn(x.shape, generator=gen).to(x.device)
    back = _apply(model(_apply(noisy, rots, flips, inverse=False)), rots, flips, inverse=True)
    consistency = (back.softmax(1) - p).pow(2).mean()
    return entropy_weight * entropy.mean() + consistency_weight * consistency


@register_method("iopfl")
class IOPFL(FedAvg):
    """Inside: FedAvg of the local models; each site keeps its trajectory
    ``traj <- alpha * traj + (1 - alpha) * w_local`` and is evaluated with it. Outside: a
    site named in ``unseen`` never trains or contributes; it receives the sites'
    trajectories and the global model, routes every convolution over them and adapts the
    routers and BN affine parameters on its unlabelled images before it is evaluated.

    Reference: Jiang, Yang, Cheng, Dou, "IOP-FL: Inside-Outside Personalization for
    Federated Medical Image Segmentation", IEEE TMI 2023; code med-air/IOP-FL.
    """

    class Config(MethodConfig):
        """IOP-FL settings: the trajectory and the test-time routing."""

        alpha: float = Field(0.1, ge=0, le=1)
        """Weight of the previous trajectory (the code's 0.1: 90 % on the newest local model)."""
        unseen: tuple[str, ...] = ()
        """Sites outside the federation: evaluated with test-time routing only."""
        tta_epochs: int = Field(10, ge=0)
        """Passes over an unseen site's unlabelled training images."""
        tta_lr: float = Field(1e-3, gt=0)
        """Adam learning rate of the adaptation."""
        entropy_weight: float = Field(10.0, ge=0)
        consistency_weight: float = Field(0.1, ge=0)
        noise_std: float = Field(0.5, ge=0)
        """Gaussian noise added to the transformed copy."""
        route_dropout: float = Field(0.2, ge=0, lt=1)
        """Dropout between the routers' two linear layers."""

        @model_validator(mode="after")
        def _distinct(self) -> IOPFL.Config:
            if len(set(self.unseen)) != len(self.unseen):
                raise ValueError(f"unseen lists a site twice: {list(self.unseen)}")
            return self

    config: Config
    personalized = True
    summary = "IOP-FL: FedAvg, local trajectories inside; test-time routing for unseen sites"

    def __init__(
        self,
        config: Config,  # type: ignore[override]
        spec: FederationSpec,
        model: ModelConfig | None = None,
    ) -> None:
        super().__init__(config, spec, model)
        if len(config.unseen) >= len(self.spec.sites):
            raise ConfigError("method.unseen: at least one site must train in the federation")

    def _seen(self, site: str) -> bool:
        return site not in self.config.unseen

    # -- templates ---------------------------------------------------------------------------
    def upload_template(self, model: nn.Module) -> Template:
        out = super().upload_template(model)
        if self.config.unseen:  # an unseen site uploads nothing; seen uploads checked below
            out = {k: TensorSpec(s.shape, s.dtype, True) for k, s in out.items()}
        return out

    def download_template(self, model: nn.Module) -> Template:
        out = super().download_template(model)
        if self.config.unseen:
            # by index: a Flower site knows the other sites only by their index
            sd = model.state_dict()
            for i in range(len(self.spec.sites)):
                out |= {
                    f"{EXPERT}{i}.{k}": TensorSpec(tuple(v.shape), v.dtype, True)
                    for k, v in sd.items()
                }
        return out

    # -- initial state ----------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        """FedAvg's initial payloads, after checking ``unseen`` against the site names (only
        the server knows them all)."""
        unknown = sorted(set(self.config.unseen) - set(self.spec.site_names))
        if unknown:
            raise ConfigError(
                f"method.unseen: unknown sites {unknown}; sites: {self.spec.site_names}"
            )
        return super().init_server(model)

    # -- steps ------------------------------------------------------------------------------
    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        if not self._seen(ctx.site.name):
            return ClientResult(Payload(num_examples=ctx.site.num_train), state)
        glob = Payload({k: v for k, v in payload.tensors.items() if not k.startswith(EXPERT)})
        res = super().client_step(glob, state, ctx)
        res.state["traj"] = update_trajectory(
            state.get("traj"), res.upload.tensors, self.config.alpha
        )
        return res

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        seen = {s: u for s, u in uploads.items() if self._seen(s)}
        keys = {frozenset(u.tensors) for u in seen.values()}
        if len(keys) != 1 or not next(iter(keys)):
            raise UploadError("IOP-FL: every site in the federation uploads its whole model")
        glob = weighted_average(seen)
        trajs = dict(state.get("traj", {}))
        for s, u in seen.items():
            trajs[s] = update_trajectory(trajs.get(s), u.tensors, self.config.alpha)
        inside = Payload(glob)
        payloads = {s.name: inside for s in ctx.spec.sites if self._seen(s.name)}
        if self.config.unseen:
            experts = {
                f"{EXPERT}{ctx.spec.site(s).index}.{k}": v
                for s, t in trajs.items()
                for k, v in t.items()
            }
            outside = Payload({**glob, **experts})
            payloads |= {s: outside for s in self.config.unseen}
        return ServerResult(payloads, {"traj": trajs})

    # -- evaluation -------------------------------------------------------------------------
    def eval_model(self, payload: Payload, state: State, ctx: ClientContext) -> nn.Module:
        model = ctx.model
        glob = {k: v for k, v in payload.tensors.items() if not k.startswith(EXPERT)}
        if self._seen(ctx.site.name):
            model.load_state_dict(state.get("traj", glob))
            return model
        model.load_state_dict(glob)
        experts = per_site(payload, EXPERT)
        if not experts or self.config.tta_epochs == 0:
            return model  # before the first round: the initial global model
        return self.adapt(
            routed_model(model, [*experts.values(), glob], self.config.route_dropout), ctx
        )

    def adapt(self, routed: nn.Module, ctx: ClientContext) -> nn.Module:
        """Test-time routing: train the routers and the BN affine parameters on the site's
        unlabelled training images (labels are never read) for ``tta_epochs`` passes."""
        cfg = self.config
        params = []
        for m in routed.modules():
            if isinstance(m, RoutedConv):
                params += list(m.router.parameters())
            elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                params += [m.weight, m.bias]
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.Adam(params, lr=cfg.tta_lr)
        scaler = grad_scaler(ctx.device)
        routed.train()
        with channels_last_model(routed):
            for _ in range(cfg.tta_epochs):
                for images, _labels in ctx.ordered_batches():
                    with autocast(ctx.device):
                        loss = adaptation_loss(
                            routed,
                            memory_format(images),
                            ctx.generator,
                            noise_std=cfg.noise_std,
                            entropy_weight=cfg.entropy_weight,
                            consistency_weight=cfg.consistency_weight,
                        )
                    backward_step(opt, loss, scaler)
        routed.requires_grad_(False)
        return routed
