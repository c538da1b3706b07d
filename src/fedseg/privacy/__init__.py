"""Differential privacy of the released model: the ``privacy:`` block (docs/privacy.md).

:mod:`~fedseg.privacy.settings` holds the block, :mod:`~fedseg.privacy.accountant` the
epsilon of a run (dp-accounting), :mod:`~fedseg.privacy.central` DP-FedAvg as a wrapper
around a FedAvg-family method, so every engine runs the same private steps.
"""

from fedseg.privacy.accountant import epsilon, privacy_report, rounds_within_budget
from fedseg.privacy.central import CentralDP, private_method, supported_methods
from fedseg.privacy.settings import PrivacySettings

__all__ = [
    "CentralDP",
    "PrivacySettings",
    "epsilon",
    "privacy_report",
    "private_method",
    "rounds_within_budget",
    "supported_methods",
]
