"""The ``privacy:`` block of a run configuration (docs/privacy.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

__all__ = ["PrivacySettings"]


class PrivacySettings(BaseModel):
    """Client-level differential privacy of the released global model (DP-FedAvg)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["off", "central"] = "off"
    """``central``: each site clips its update (upload minus the payload it started from) to
    ``clip`` in L2; the server sums the clipped updates with fixed weights and adds Gaussian
    noise of standard deviation ``noise_multiplier * clip * max weight``."""
    clip: PositiveFloat = 1.0
    """L2 bound of one site's update (every float tensor it uploads, BN statistics included)."""
    noise_multiplier: PositiveFloat = 1.0
    """Noise standard deviation in units of the sum's sensitivity (z of DP-FedAvg)."""
    weighting: Literal["uniform", "samples"] = "uniform"
    """Fixed aggregation weights: ``uniform`` (1/number of sites, DP-FedAvg) or ``samples``
    (each site's declared training-sample share of the whole federation); the denominator
    never depends on who replied, so a dropout cannot raise the sensitivity."""
    delta: float = Field(1e-5, gt=0, lt=1)
    """The delta at which epsilon is reported."""
    accountant: Literal["rdp", "pld"] = "rdp"
    """dp-accounting's Renyi-DP or privacy-loss-distribution accountant."""
    target_epsilon: PositiveFloat | None = None
    """Stop training before the round whose release would take epsilon above this value."""

    @property
    def enabled(self) -> bool:
        return self.mode != "off"
