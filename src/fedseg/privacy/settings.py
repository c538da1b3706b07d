"""The ``privacy:`` block of a run configuration (docs/privacy.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

__all__ = ["PrivacySettings", "SecureAggregation"]


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

    @property
    def enabled(self) -> bool:
        return self.mode != "off"
