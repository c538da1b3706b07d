"""Central differential privacy (DP-FedAvg, McMahan et al. 2018) around a FedAvg-family method.

:class:`CentralDP` wraps the configured method, so every engine (in-process, worker pool,
Flower) runs the same steps. A site runs the method's own client step, then uploads its
update (the uploaded tensors minus the payload it started from) clipped to ``clip`` in L2
over every float tensor, BN statistics included. The server clips each update again (a
site that skips its own clipping gains nothing), sums them with fixed weights, adds Gaussian
noise of standard deviation ``noise_multiplier * clip * max weight`` from the round's seeded
generator, and adds the result to the previous global model. Integer tensors (BN batch
counters) carry no update: the global keeps its own. Epsilon after the round (dp-accounting)
is a server metric of the round, so it lands in ``rounds.jsonl``.

Options (all post-processing or accounted): ``adaptive_clip`` (Andrew et al. 2021: the
server clips with a clip that follows a quantile of the update norms, learnt from a noised
count of the unclipped updates), ``server_momentum`` (the global model moves by a momentum
average of the noised aggregates) and ``freeze`` (frozen parameters get no update and no
noise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from fedseg.errors import ConfigError
from fedseg.methods import Method
from fedseg.methods.base import (
    Aggregator,
    ClientContext,
    ClientResult,
    Payload,
    ServerContext,
    ServerResult,
    SiteSpec,
    State,
    Template,
    aggregate,
)
from fedseg.methods.fedavg import FedAvg
from fedseg.privacy.accountant import epsilon
from fedseg.privacy.settings import PrivacySettings
from fedseg.privacy.wrapper import PrivateWrapper, frozen_names

__all__ = [
    "CentralDP",
    "NoisySum",
    "adaptive_noise",
    "clip_update",
    "fixed_weights",
    "require_central_dp",
    "supported_methods",
    "supports_central_dp",
    "update_norm",
]

GLOBAL = "dp_global"
"""Server-state key of the current global tensors (the same tensors as the payload)."""
CLIP = "dp_clip"
"""Server-state key of the current clip (``adaptive_clip``)."""
VELOCITY = "dp_velocity"
"""Server-state key of the server momentum's velocity (``server_momentum``)."""


def adaptive_noise(settings: PrivacySettings, sites: int) -> tuple[float, float]:
    """The noise multiplier of the updates and the standard deviation of the noise on the
    count of unclipped updates. With ``adaptive_clip`` (Andrew et al. 2021, Sec. 3.1) the two
    Gaussian releases of a round cost together what one of multiplier ``z`` costs:
    ``z**-2 = z_update**-2 + (2 sigma_b)**-2`` (the count's sensitivity is 1/2 after
    centring each site's bit); without it, ``(z, 0)``."""
    z, adaptive = settings.noise_multiplier, settings.adaptive_clip
    if adaptive is None:
        return z, 0.0
    sd = adaptive.count_noise if adaptive.count_noise is not None else sites / 20
    if z >= 2 * sd:
        raise ConfigError(
            f"privacy.adaptive_clip.count_noise: {sd:g} is too small for noise_multiplier "
            f"{z:g} (it must exceed noise_multiplier / 2; default: sites / 20 = {sites / 20:g})"
        )
    return (z**-2 - (2 * sd) ** -2) ** -0.5, sd


def supports_central_dp(cls: type[Method]) -> bool:
    """True for a method whose server step is FedAvg's weighted sum of the uploads."""
    return issubclass(cls, FedAvg) and cls.server_step is FedAvg.server_step


def require_central_dp(name: str, cls: type[Method]) -> None:
    """ConfigError saying why method ``name`` cannot run under ``privacy.mode: central``."""
    if supports_central_dp(cls):
        return
    raise ConfigError(
        f"privacy.mode central: method {name!r} is not supported: its server step "
        f"({cls.server_step.__qualname__}) is not FedAvg's weighted sum of the uploads, the "
        "one aggregation whose noised sum this DP covers (others read each site's upload or "
        "weigh by data); supported: " + ", ".join(supported_methods())
    )


def supported_methods() -> list[str]:
    """Registered methods that ``privacy.mode: central`` accepts."""
    from fedseg.methods import get_method, list_methods

    return [n for n in list_methods("*") if supports_central_dp(get_method(n))]


def update_norm(update: Mapping[str, torch.Tensor]) -> float:
    """L2 norm over every float tensor of ``update`` (computed in float64)."""
    total = math.fsum(
        float(t.double().square().sum()) for t in update.values() if t.is_floating_point()
    )
    return math.sqrt(total)


def clip_update(update: Mapping[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """``update`` scaled by ``min(1, clip / norm)``; integer tensors become zeros."""
    scale = min(1.0, clip / max(update_norm(update), 1e-300))
    return {
        k: (t.double() * scale).to(t.dtype) if t.is_floating_point() else torch.zeros_like(t)
        for k, t in update.items()
    }


def fixed_weights(settings: PrivacySettings, sites: tuple[SiteSpec, ...]) -> dict[str, float]:
    """Each site's fixed aggregation weight: 1/m, or its share of all declared samples."""
    if settings.weighting == "uniform":
        return {s.name: 1.0 / len(sites) for s in sites}
    total = sum(s.num_train for s in sites)
    return {s.name: s.num_train / total for s in sites}


class CentralDP(PrivateWrapper):
    """``inner`` (a FedAvg-family method) with clipped updates and a noised weighted sum."""

    def __init__(self, inner: Method, settings: PrivacySettings, name: str) -> None:
        require_central_dp(name, type(inner))
        super().__init__(inner, settings, name, "central DP")
        self.weights = fixed_weights(settings, inner.spec.sites)
        self.update_noise, self.count_noise = adaptive_noise(settings, len(inner.spec.sites))
        self.frozen = set(frozen_names(inner.build_model(), settings.freeze))
        """Frozen parameters: no update and no noise (their values are public)."""

    def upload_template(self, model: nn.Module) -> Template:
        up, down = self.inner.upload_template(model), self.inner.download_template(model)
        odd = sorted(set(up) ^ set(down))
        if odd:
            raise ConfigError(
                f"privacy.mode central: method {self.name!r} uploads or downloads {odd[:3]} "
                "without the other; a site's update needs both"
            )
        return up

    # -- the private steps --------------------------------------------------------------------
    def init_server(self, model: nn.Module) -> ServerResult:
        out = self.inner.init_server(model)
        first = next(iter(out.payloads.values()))
        state = {**out.state, GLOBAL: first.tensors}
        if self.settings.adaptive_clip is not None:
            state[CLIP] = self.settings.clip
        if self.settings.server_momentum:
            state[VELOCITY] = {
                k: torch.zeros_like(t, dtype=torch.float64)
                for k, t in first.tensors.items()
                if t.is_floating_point()
            }
        return ServerResult(out.payloads, state)

    def client_step(self, payload: Payload, state: State, ctx: ClientContext) -> ClientResult:
        """The method's client step; its upload replaced by the clipped update (with
        ``adaptive_clip`` the update: the trusted server clips it with the current clip).
        The update's norm before clipping joins the step's metrics (for choosing ``clip``;
        the server of central DP is trusted, and under secure aggregation no metric leaves
        the site)."""
        res = self.inner.client_step(payload, state, ctx)
        update = {k: t - payload.tensors[k].to(t.device) for k, t in res.upload.tensors.items()}
        adaptive = self.settings.adaptive_clip is not None
        clipped = update if adaptive else clip_update(update, self.settings.clip)
        metrics = {**res.metrics, "update_norm": update_norm(update)}
        return ClientResult(
            Payload(clipped, num_examples=res.upload.num_examples), res.state, metrics
        )

    def server_step(
        self, uploads: Mapping[str, Payload], state: State, ctx: ServerContext
    ) -> ServerResult:
        return aggregate(self.aggregator(state, ctx), uploads)

    def aggregator(self, state: State, ctx: ServerContext) -> Aggregator:
        return NoisySum(self, state, ctx)


class NoisySum:
    """The server step of :class:`CentralDP` as a reduction: one float64 sum of the clipped,
    weighted updates; noise and the previous global added once in :meth:`finish`."""

    def __init__(self, dp: CentralDP, state: State, ctx: ServerContext) -> None:
        self.dp, self.state, self.ctx = dp, state, ctx
        self.sum: dict[str, torch.Tensor] = {}
        self.clip: float = state.get(CLIP, dp.settings.clip)
        self.unclipped = 0
        """Uploads within the clip (``adaptive_clip``)."""

    def add(self, site: str, upload: Payload) -> None:
        self.unclipped += update_norm(upload.tensors) <= self.clip
        self.add_sum(clip_update(upload.tensors, self.clip), self.dp.weights[site])

    def add_sum(self, tensors: Mapping[str, torch.Tensor], weight: float = 1.0) -> None:
        """Add ``weight`` times ``tensors``: one site's clipped update, or (secure
        aggregation) the weighted sum of several sites' updates, never seen one by one."""
        base = self.state[GLOBAL]
        for k, t in tensors.items():
            if not t.is_floating_point():
                continue
            t = t.to(base[k].device, torch.float64)  # a site's update may be on its GPU
            if k in self.sum:
                self.sum[k].add_(t, alpha=weight)
            else:
                self.sum[k] = t * weight

    def finish(self) -> ServerResult:
        dp, s = self.dp, self.dp.settings
        std = dp.update_noise * self.clip * max(dp.weights.values())
        base: dict[str, torch.Tensor] = self.state[GLOBAL]
        velocity: dict[str, torch.Tensor] | None = self.state.get(VELOCITY)
        new, moved = {}, {}
        for k, t in base.items():
            if not t.is_floating_point() or k in dp.frozen:
                new[k] = t
                continue
            noise = torch.randn(t.shape, generator=self.ctx.generator, dtype=torch.float64)
            step = self.sum.get(k, 0.0) + std * noise
            if velocity is not None:
                step = moved[k] = s.server_momentum * velocity[k] + step
            value = t.double() + step
            if k.endswith("running_var"):
                value = value.clamp(min=0.0)  # post-processing: a variance stays >= 0
            new[k] = value.to(t.dtype)
        payload = Payload(new)
        metrics = {"dp_epsilon": epsilon(s, self.ctx.round + 1), "dp_delta": s.delta}
        state = {**self.state, GLOBAL: new} | ({VELOCITY: velocity | moved} if moved else {})
        if (adaptive := s.adaptive_clip) is not None:
            count = self.unclipped + dp.count_noise * float(
                torch.randn((), generator=self.ctx.generator, dtype=torch.float64)
            )
            share = count / len(dp.weights)
            rate, target = adaptive.learning_rate, adaptive.quantile
            state[CLIP] = self.clip * math.exp(-rate * (share - target))
            metrics |= {"dp_clip": self.clip, "dp_unclipped_share": share}
        return ServerResult(
            {site.name: payload for site in self.ctx.spec.sites},
            state,
            metrics | {"dp_noise_std": std},
        )
