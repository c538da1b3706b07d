"""Exception hierarchy: every error carries a human-readable ``reason``."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "FedsegError", "RegistryError", "UploadError"]


class FedsegError(Exception):
    """Base class of fedseg's errors; ``reason`` says what was expected and what was found."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConfigError(FedsegError):
    """A configuration file or value is invalid."""


class DataError(FedsegError):
    """A dataset on disk is missing, malformed or inconsistent."""


class RegistryError(FedsegError, KeyError):
    """A name is unknown to, or already taken in, a registry."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.reason


class UploadError(FedsegError):
    """A client's upload does not match what the method declared."""
