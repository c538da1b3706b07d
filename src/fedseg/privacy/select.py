"""The configured method under the ``privacy:`` block's mode."""

from __future__ import annotations

from fedseg.methods import Method
from fedseg.privacy.central import CentralDP, require_central_dp
from fedseg.privacy.local import LocalDP, require_local_dp
from fedseg.privacy.settings import PrivacySettings
from fedseg.privacy.wrapper import PrivateWrapper

__all__ = ["private_method", "require_supported"]


def require_supported(settings: PrivacySettings, name: str, cls: type[Method]) -> None:
    """ConfigError saying why method ``name`` cannot run under ``settings.mode``."""
    if settings.mode == "central":
        require_central_dp(name, cls)
    elif settings.mode == "local":
        require_local_dp(name, cls)


def private_method(method: Method, settings: PrivacySettings, name: str) -> Method:
    """``method`` under the ``privacy:`` block: unchanged when it is off (built from
    ``init_from`` if given)."""
    if settings.mode == "central":
        return CentralDP(method, settings, name)
    if settings.mode == "local":
        return LocalDP(method, settings, name)
    if settings.init_from is not None:
        return PrivateWrapper(method, settings, name, "from init_from")
    return method
