"""Differential privacy of what sites release: the ``privacy:`` block (docs/privacy.md).

:mod:`~fedseg.privacy.settings` holds the block, :mod:`~fedseg.privacy.accountant` the
epsilon of a run (dp-accounting), :mod:`~fedseg.privacy.central` DP-FedAvg and
:mod:`~fedseg.privacy.local` per-site DP-SGD, each a wrapper around the configured method
(:mod:`~fedseg.privacy.select`), so every engine runs the same private steps.
"""

from fedseg.privacy.accountant import (
    epsilon,
    privacy_report,
    rounds_within_budget,
    sgd_epsilon,
    steps_within_budget,
)
from fedseg.privacy.central import CentralDP, supported_methods
from fedseg.privacy.local import LocalDP, supported_local_methods
from fedseg.privacy.select import private_method, require_supported
from fedseg.privacy.settings import PrivacySettings

__all__ = [
    "CentralDP",
    "LocalDP",
    "PrivacySettings",
    "epsilon",
    "privacy_report",
    "private_method",
    "require_supported",
    "rounds_within_budget",
    "sgd_epsilon",
    "steps_within_budget",
    "supported_local_methods",
    "supported_methods",
]
