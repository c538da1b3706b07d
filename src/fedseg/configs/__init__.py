"""Run configurations shipped with fedseg, addressable by name (``fedseg run quickstart``).

The YAML files in this folder (and its subfolders, one per paper) are package data; the
repository's ``configs/`` points here.
"""

from __future__ import annotations

from pathlib import Path

from fedseg.errors import ConfigError

__all__ = ["PACKAGED_CONFIGS", "packaged_configs", "resolve_config"]

PACKAGED_CONFIGS = Path(__file__).parent
"""The configurations shipped with fedseg (``fedseg configs list``)."""


def packaged_configs() -> list[str]:
    """Names of the shipped configurations, e.g. ``quickstart``, ``fedlppa/table7_full``."""
    return sorted(
        p.relative_to(PACKAGED_CONFIGS).with_suffix("").as_posix()
        for p in PACKAGED_CONFIGS.rglob("*.yaml")
    )


def resolve_config(ref: str | Path) -> Path:
    """A config file path, or the name of a shipped config (``quickstart``,
    ``fedlppa/table7_full``); ConfigError naming both places when neither exists."""
    path = Path(ref)
    if path.is_file():
        return path
    name = path.as_posix().removesuffix(".yaml")
    shipped = PACKAGED_CONFIGS / f"{name}.yaml"
    if not path.is_absolute() and shipped.is_file():
        return shipped
    raise ConfigError(
        f"config {ref} is neither a file nor a shipped config name "
        "(`fedseg configs list` shows the shipped ones)"
    )
