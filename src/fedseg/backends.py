"""Values of ``engine.backend``: the in-process engine, or Flower's simulation engine with
its per-site resources. Pure settings (no Flower import), read by the config's validation
and by the runner that picks the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedseg.errors import ConfigError

__all__ = ["BACKENDS", "SimSettings", "sim_settings"]

BACKENDS = ("inprocess", "flower-sim")
"""Values of ``engine.backend`` (its name, when it is a mapping)."""


class SimSettings(BaseModel):
    """``engine.backend`` as a mapping for Flower's simulation engine: per-site resources."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "flower-sim"
    cpus: float = Field(1.0, gt=0)
    """CPU cores Ray reserves for each site's client step (sites run in parallel as far as
    the cores allow)."""
    gpus: float = Field(0.0, ge=0)
    """Fraction of a GPU per site (0.25: four sites share one GPU); 0: CPU only."""
    ray_address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://HOST:10001``); default: a local Ray started
    for the run and stopped after it."""


def sim_settings(backend: str | Mapping[str, Any]) -> SimSettings | None:
    """The simulation settings of ``engine.backend`` (None for the in-process engine);
    ConfigError naming the field for a bad value."""
    name = backend if isinstance(backend, str) else backend.get("name", "")
    if name not in BACKENDS:
        raise ConfigError(f"engine.backend: unknown backend {name!r}; choose from {BACKENDS}")
    if name == "inprocess":
        if not isinstance(backend, str) and len(backend) > 1:
            raise ConfigError("engine.backend: the inprocess backend takes no settings")
        return None
    try:
        return SimSettings() if isinstance(backend, str) else SimSettings(**backend)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"engine.backend.{where}: {err['msg']}") from None
