"""The ``privacy:`` block of a run configuration (docs/privacy.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    field_validator,
    model_validator,
)

__all__ = ["MAX_NOISE", "AdaptiveClip", "PrivacySettings", "SecureAggregation"]

MAX_NOISE = 1e6
"""The largest ``noise_multiplier`` and noise standard deviation ``noise_multiplier * clip``
taken: noise far above any parameter's scale leaves nothing of the model to train (the next
round's uploads overflow), and dp-accounting's arithmetic overflows far above it (1e300)."""


class AdaptiveClip(BaseModel):
    """Quantile-based adaptive clipping of central DP (Andrew et al. 2021, NeurIPS): after
    each round ``clip <- clip * exp(-learning_rate * (b - quantile))``, ``b`` the noised share
    of the round's updates that were not clipped; ``clip`` is the first round's value."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    quantile: float = Field(0.5, gt=0, lt=1)
    """The target share of sites' updates left unclipped (gamma)."""
    learning_rate: PositiveFloat = 0.2
    """Step of the geometric update of the clip (eta_C)."""
    count_noise: PositiveFloat | None = None
    """Standard deviation of the Gaussian noise on the count of unclipped updates (sigma_b);
    default: the number of sites / 20, as the paper recommends. Must exceed
    ``noise_multiplier / 2``."""


class SecureAggregation(BaseModel):
    """Flower's SecAgg+ protocol: the server learns only the sum of the sites' updates."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    neighbours: float = Field(1.0, gt=0, le=1)
    """Share of a round's sites each site exchanges key shares with (1: all, i.e. SecAgg);
    Flower rounds it to an odd count of at least 3."""
    threshold: float = Field(0.5, gt=0, le=1)
    """Share of a site's neighbours whose key shares unmask the sum (at least 2): the round
    survives dropouts as long as every site keeps that many live neighbours."""


class PrivacySettings(BaseModel):
    """Differential privacy of what sites release: client-level (``central``, DP-FedAvg) or
    example-level at each site (``local``, DP-SGD)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["off", "central", "local"] = "off"
    """``central``: each site clips its update (upload minus the payload it started from) to
    ``clip`` in L2; the server sums the clipped updates with fixed weights and adds Gaussian
    noise of standard deviation ``noise_multiplier * clip * max weight``. ``local``: every
    site trains with DP-SGD (Poisson-sampled batches, each sample's gradient clipped to
    ``clip``, Gaussian noise of standard deviation ``noise_multiplier * clip`` per step)."""
    clip: PositiveFloat = 1.0
    """L2 bound of one site's update (``central``: every float tensor it uploads, BN
    statistics included) or of one sample's gradient (``local``)."""
    noise_multiplier: PositiveFloat = 1.0
    """Noise standard deviation in units of the sensitivity ``clip`` (z)."""
    weighting: Literal["uniform", "samples"] = "uniform"
    """``central`` only. Fixed aggregation weights: ``uniform`` (1/number of sites,
    DP-FedAvg) or ``samples`` (each site's declared training-sample share of the whole
    federation); the denominator never depends on who replied, so a dropout cannot raise
    the sensitivity."""
    delta: float = Field(1e-5, gt=0, lt=1)
    """The delta at which epsilon is reported."""
    target_epsilon: PositiveFloat | None = None
    """``central``: stop training before the round whose release would take epsilon above
    this value; ``local``: a site takes no DP-SGD step that would."""

    adaptive_clip: AdaptiveClip | None = None
    """``central`` only: adapt ``clip`` each round towards a quantile of the sites' update
    norms; the noise on the count shares the privacy budget, so epsilon stays that of
    ``noise_multiplier`` and the updates' noise is raised to compensate."""
    server_momentum: float = Field(0.0, ge=0, lt=1)
    """``central`` only: the global model moves by a momentum (heavy-ball) average of the
    noised aggregates, post-processing that costs no privacy (0: plain DP-FedAvg)."""
    init_from: Path | None = None
    """A run directory (or its ``checkpoints/*.pt``) whose global model initialises the
    network, e.g. one trained without DP on another federation."""
    freeze: tuple[str, ...] = ()
    """Parameter-name patterns (fnmatch, e.g. ``encoder.*``) kept at their ``init_from``
    values: only the rest trains, and only the rest is noised under ``central``."""

    secure_aggregation: SecureAggregation | None = None
    """Sum the clipped updates with Flower's SecAgg+ (Flower engines only; needs
    ``mode: central``, whose clip bounds the values the protocol quantises)."""

    @model_validator(mode="after")
    def _secure_needs_central(self) -> PrivacySettings:
        if self.secure_aggregation is not None and self.mode != "central":
            raise ValueError(
                "secure_aggregation needs mode: central: SecAgg+ quantises values within a "
                "fixed range, which the clip of central DP bounds"
            )
        return self

    @model_validator(mode="after")
    def _central_only(self) -> PrivacySettings:
        if self.mode != "central":
            if self.adaptive_clip is not None:
                raise ValueError("adaptive_clip needs mode: central (it adapts the update clip)")
            if self.server_momentum:
                raise ValueError("server_momentum needs mode: central")
        if self.adaptive_clip is not None and self.secure_aggregation is not None:
            raise ValueError(
                "adaptive_clip does not combine with secure_aggregation: the server clips each "
                "update with the current clip and counts the unclipped ones"
            )
        if self.freeze and self.init_from is None:
            raise ValueError("freeze needs init_from: frozen parameters keep their initial values")
        return self

    @field_validator("mode", mode="before")
    @classmethod
    def _off_word(cls, v: object) -> object:
        """YAML reads ``off`` (and ``no``, ``false``) as false: take it as the user means."""
        return "off" if v is False else v

    @model_validator(mode="after")
    def _bounded_noise(self) -> PrivacySettings:
        if self.mode == "local" and self.weighting != "uniform":
            raise ValueError(
                f"weighting: {self.weighting} needs mode: central (local DP-SGD fixes no "
                "aggregation weights: the method aggregates as it does without DP)"
            )
        if self.enabled:
            std = self.noise_multiplier * self.clip
            if self.noise_multiplier > MAX_NOISE:
                raise ValueError(
                    f"noise_multiplier {self.noise_multiplier:g}: expected at most {MAX_NOISE:g}"
                )
            if std > MAX_NOISE:
                raise ValueError(
                    f"clip {self.clip:g} * noise_multiplier {self.noise_multiplier:g} = "
                    f"{std:g}: the noise's standard deviation must be at most {MAX_NOISE:g} "
                    "(lower clip or noise_multiplier)"
                )
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "off"
