"""Epsilon from dp-accounting's Renyi-DP accountant (the one Flower wraps).

Central DP (DP-FedAvg): every site takes part in every round (no sampling amplification),
so ``rounds`` releases of the Gaussian mechanism with noise multiplier ``z`` compose to one
epsilon at ``delta`` (neighbouring federations: one site added or removed). dp-accounting's
tighter PLD accountant is not offered: at the noise multipliers federations of a few sites
use it needs seconds to minutes and gigabytes per evaluation (z = 1, 25 rounds: 23 s,
0.9 GB), about 10% below the RDP bound.

Local DP-SGD: each of a site's steps is the Gaussian mechanism with multiplier ``z`` on a
Poisson sample of its data at rate ``q = min(1, batch_size / n)`` (neighbouring datasets: one
example added or removed); ``steps`` of them compose to the site's epsilon. Integer RDP
orders 2..256 are used: dp-accounting's fractional orders below 2 fail to converge at the
rates sites use and are dropped with a warning each time.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from fedseg.errors import ConfigError
from fedseg.privacy.settings import PrivacySettings

__all__ = [
    "epsilon",
    "privacy_report",
    "rounds_within_budget",
    "sgd_epsilon",
    "steps_within_budget",
]

ORDERS = tuple(range(2, 257))
"""RDP orders of the DP-SGD accountant."""


def _library() -> Any:
    try:
        import dp_accounting
        import dp_accounting.rdp
    except ImportError:
        raise ConfigError(
            "privacy: the accountant needs dp-accounting (pip install 'fedseg[privacy]')"
        ) from None
    return dp_accounting


def epsilon(settings: PrivacySettings, rounds: int) -> float:
    """Epsilon at ``settings.delta`` after ``rounds`` noised aggregates (0 for none)."""
    if rounds <= 0:
        return 0.0
    dpa = _library()
    event = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(settings.noise_multiplier), rounds)
    with _arithmetic(settings):
        return float(dpa.rdp.RdpAccountant().compose(event).get_epsilon(settings.delta))


@functools.cache
def sgd_epsilon(settings: PrivacySettings, rate: float, steps: int) -> float:
    """A site's epsilon at ``settings.delta`` after ``steps`` DP-SGD steps on Poisson
    samples at ``rate`` (0 for none)."""
    if steps <= 0:
        return 0.0
    dpa = _library()
    step = dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(settings.noise_multiplier))
    accountant = dpa.rdp.RdpAccountant(ORDERS)
    with _arithmetic(settings):
        return float(accountant.compose(step, steps).get_epsilon(settings.delta))


@contextlib.contextmanager
def _arithmetic(settings: PrivacySettings) -> Iterator[None]:
    """Name the setting where the accountant's arithmetic breaks down (an extreme
    ``noise_multiplier``) instead of a bare OverflowError or ZeroDivisionError."""
    try:
        yield
    except (OverflowError, ZeroDivisionError) as e:
        raise ConfigError(
            f"privacy.noise_multiplier {settings.noise_multiplier:g}: the accountant cannot "
            f"compute epsilon there ({e})"
        ) from None


def _last_within(target: float, eps: Callable[[int], float], most: int) -> int:
    """The largest ``k <= most`` with ``eps(k) <= target`` (``eps`` grows with ``k``)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if eps(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def rounds_within_budget(settings: PrivacySettings, rounds: int) -> int:
    """How many of ``rounds`` rounds keep epsilon within ``settings.target_epsilon``
    (``local`` mode: all of them; each site stops its own steps, :func:`steps_within_budget`)."""
    target = settings.target_epsilon
    if settings.mode != "central" or target is None:
        return rounds
    return _last_within(target, lambda k: epsilon(settings, k), rounds)


@functools.cache
def steps_within_budget(settings: PrivacySettings, rate: float) -> int | None:
    """How many DP-SGD steps at ``rate`` keep a site within ``settings.target_epsilon``
    (None without a target)."""
    target = settings.target_epsilon
    if target is None:
        return None
    most = 1
    while sgd_epsilon(settings, rate, most) <= target:
        most *= 2
    return _last_within(target, lambda k: sgd_epsilon(settings, rate, k), most)


def privacy_report(
    settings: PrivacySettings, rounds: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The ``privacy`` entry of ``results.json`` from the run's round records: ``central``,
    epsilon after as many released aggregates; ``local``, each site's epsilon after its last
    round (``per_site``) and their maximum (``epsilon``)."""
    out = {**settings.model_dump(mode="json"), "rounds": len(rounds)}
    if settings.mode != "local":
        return out | {"epsilon": epsilon(settings, len(rounds))}
    per_site: dict[str, float] = {}
    for record in rounds:
        for site, metrics in record["clients"].items():
            per_site[site] = metrics["dp_epsilon"]
    return out | {"epsilon": max(per_site.values(), default=0.0), "per_site": per_site}
