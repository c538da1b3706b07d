"""What a Flower run is told: the run config (server and sites) and each site's node config.

The run config travels inside the Flower App bundle (FAB) that ``flwr run`` submits: the
resolved fedseg YAML (``fedseg-config``) plus the coordinator's settings (run directory,
site order, fault tolerance). Each SuperNode has its own node config (``--node-config``):
its site name, its data folder and where it keeps its private state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import RunConfig, dump_config, parse_config
from fedseg.errors import ConfigError

__all__ = [
    "FlowerSettings",
    "SiteConfig",
    "app_pyproject",
    "run_config",
    "run_config_of",
]

CONFIG_KEY = "fedseg-config"


@dataclass(frozen=True)
class FlowerSettings:
    """The coordinator's settings of one Flower run (keys of the Flower run config)."""

    run_dir: Path
    """Run directory on the machine running the ServerApp (the SuperLink host)."""
    resume: bool = False
    """Continue the run in ``run_dir`` after its last checkpointed round."""
    overwrite: bool = False
    """Replace a finished or failed run already in ``run_dir``."""
    sites: tuple[str, ...] = ()
    """Site order (global indices); default ``data.sites`` of the config, else sorted names."""
    min_sites: int = 0
    """Sites whose valid upload a round needs (0: a majority of the federation)."""
    round_timeout: float = 3600.0
    """Seconds to wait for the replies of one round (or of the final evaluation)."""
    join_timeout: float = 600.0
    """Seconds to wait for enough sites to connect before a round."""
    retries: int = 2
    """Extra attempts of a round that got fewer than ``min_sites`` valid uploads."""
    poll_interval: float = 0.5
    """Seconds between polls for replies."""
    reuse_payloads: bool = True
    """Send a site a payload it already received (the model it evaluated is the one it
    trains next) by digest only (:mod:`~fedseg.engine.flower.records`)."""

    def min_replies(self, num_sites: int) -> int:
        """The effective minimum for a federation of ``num_sites`` sites."""
        want = self.min_sites or num_sites // 2 + 1
        return max(1, min(want, num_sites))

    def to_run_config(self) -> dict[str, Any]:
        """Flower run-config entries (strings, numbers, booleans only)."""
        return {
            "run-dir": str(Path(self.run_dir).resolve()),
            "resume": self.resume,
            "overwrite": self.overwrite,
            "sites": ",".join(self.sites),
            "min-sites": self.min_sites,
            "round-timeout": float(self.round_timeout),
            "join-timeout": float(self.join_timeout),
            "retries": self.retries,
            "poll-interval": float(self.poll_interval),
            "reuse-payloads": self.reuse_payloads,
        }

    @classmethod
    def from_run_config(cls, rc: Mapping[str, Any]) -> FlowerSettings:
        """Parse the run config a ServerApp receives (ConfigError on missing or bad keys)."""
        if not rc.get("run-dir"):
            raise ConfigError("Flower run config lacks 'run-dir' (submit with `fedseg flower`)")
        s = cls(
            run_dir=Path(str(rc["run-dir"])),
            resume=bool(rc.get("resume", False)),
            overwrite=bool(rc.get("overwrite", False)),
            sites=tuple(n for n in str(rc.get("sites", "")).split(",") if n),
            min_sites=int(rc.get("min-sites", 0)),
            round_timeout=float(rc.get("round-timeout", 3600.0)),
            join_timeout=float(rc.get("join-timeout", 600.0)),
            retries=int(rc.get("retries", 2)),
            poll_interval=float(rc.get("poll-interval", 0.5)),
            reuse_payloads=bool(rc.get("reuse-payloads", True)),
        )
        for name in ("round_timeout", "join_timeout", "poll_interval"):
            v = getattr(s, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(
                    f"Flower run config: {name.replace('_', '-')} must be > 0, got {v}"
                )
        if s.min_sites < 0 or s.retries < 0:
            raise ConfigError(
                f"Flower run config: min-sites and retries must be >= 0, got "
                f"{s.min_sites} and {s.retries}"
            )
        return s


def run_config(cfg: RunConfig, settings: FlowerSettings) -> dict[str, Any]:
    """The Flower run config of ``cfg`` run with ``settings``."""
    return {CONFIG_KEY: dump_config(cfg), **settings.to_run_config()}


def run_config_of(rc: Mapping[str, Any]) -> RunConfig:
    """The fedseg run configuration carried by a Flower run config."""
    text = rc.get(CONFIG_KEY)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"Flower run config lacks {CONFIG_KEY!r} (submit with `fedseg flower`)")
    return parse_config(yaml.safe_load(text), f"Flower run config {CONFIG_KEY}")


@dataclass(frozen=True)
class SiteConfig:
    """One site's SuperNode settings (``--node-config``)."""

    name: str
    """Site name, as in the federation manifest."""
    data_dir: Path
    """Federation folder holding (at least) this site."""
    state_dir: Path | None = None
    """Where the site's private state is saved (default ``~/.fedseg/sites/<name>``)."""
    device: str | None = None
    """Overrides ``engine.device`` of the run config on this site."""
    threads: int = 0
    """CPU threads for torch (0: torch's default)."""

    @property
    def state_root(self) -> Path:
        return self.state_dir or Path.home() / ".fedseg" / "sites" / self.name

    @classmethod
    def from_node_config(cls, nc: Mapping[str, Any]) -> SiteConfig:
        """Parse a SuperNode's node config; ConfigError names a missing key."""
        missing = [k for k in ("site-name", "data-dir") if not nc.get(k)]
        if missing:
            raise ConfigError(
                f"SuperNode --node-config lacks {missing}; start sites with `fedseg flower site` "
                f'or pass --node-config \'site-name="A" data-dir="/data/fed"\' (got {dict(nc)})'
            )
        state = nc.get("state-dir")
        return cls(
            name=str(nc["site-name"]),
            data_dir=Path(str(nc["data-dir"])),
            state_dir=Path(str(state)) if state else None,
            device=str(nc["device"]) if nc.get("device") else None,
            threads=int(nc.get("threads", 0)),
        )

    def to_node_config(self) -> str:
        """The ``--node-config`` string of this site (TOML-quoted values)."""
        items: dict[str, Any] = {"site-name": self.name, "data-dir": str(self.data_dir)}
        if self.state_dir is not None:
            items["state-dir"] = str(self.state_dir)
        if self.device:
            items["device"] = self.device
        if self.threads:
            items["threads"] = self.threads
        return " ".join(f"{k}={json.dumps(v)}" for k, v in items.items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a valid TOML basic string


def app_pyproject(cfg: RunConfig, settings: FlowerSettings) -> str:
    """``pyproject.toml`` of the Flower App that runs ``cfg`` (it holds no code: the apps
    are imported from the installed fedseg package on the server and on every site)."""
    entries = run_config(cfg, settings)
    config = "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in entries.items())
    return f"""[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fedseg-run"
version = "1.0.0"
description = "fedseg run {cfg.name} ({cfg.method_name})"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedseg"

[tool.flwr.app.components]
serverapp = "fedseg.flower_server_app:app"
clientapp = "fedseg.engine.flower.client_app:app"

[tool.flwr.app.config]
{config}
"""
