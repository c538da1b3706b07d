"""A finished run directory as the reports read it: config, results, round records, sites."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedseg.engine.rundir import RunDir
from fedseg.errors import ConfigError

__all__ = [
    "Run",
    "SiteFacts",
    "flat_config",
    "load_run",
    "read_results",
    "read_rounds",
    "site_facts",
]


@dataclass(frozen=True)
class SiteFacts:
    """What a figure says about a site besides its name."""

    annotation: str
    num_train: int


@dataclass
class Run:
    """One finished run: its directory, ``config.yaml``, ``results.json`` and
    ``rounds.jsonl`` records."""

    dir: Path
    config: dict[str, Any]
    results: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The config's ``name`` (the directory name when the config has none)."""
        return str(self.config.get("name") or self.results.get("name") or self.dir.name)

    @property
    def task(self) -> str:
        """The federation's task (manifest ``task``, else ``data.synth.task``, else the
        evaluation regions)."""
        manifest = _manifest(self.dir)
        if manifest and manifest.get("task"):
            return str(manifest["task"])
        synth = (self.config.get("data") or {}).get("synth") or {}
        if synth.get("task"):
            return str(synth["task"])
        return "regions " + "+".join(next(iter(self.results["average"].values())))


def load_run(run_dir: Path) -> Run:
    """Read a finished run directory.

    Raises:
        ConfigError: no ``results.json`` (the run is unfinished) or an unreadable file,
            naming it (and the line of a damaged round record).
    """
    rd = RunDir(Path(run_dir))
    if not rd.results_json.is_file():
        raise ConfigError(f"{rd.path}: no results.json (is the run finished?)")
    results = read_results(rd.results_json)
    config = _resolved(rd.stored_config()) if rd.config.is_file() else {}
    return Run(rd.path, config, results, rd.rounds())


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with every setting it does not hold at today's default, so a run made
    before a setting existed reads as it behaved and pools with today's runs; ``config`` as
    it is where it no longer parses."""
    from fedseg.config import dump_config, parse_config

    try:
        return yaml.safe_load(dump_config(parse_config(config)))
    except ConfigError:
        return config


def read_results(path: Path) -> dict[str, Any]:
    """A run's ``results.json``; ConfigError naming ``path`` where it is cut off, not JSON,
    or lacks the per-site and average metrics (``{metric: {region: value}}``)."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: unreadable results ({e})") from None
    if not isinstance(results, dict):
        raise ConfigError(f"{path}: expected a mapping of results, got {type(results).__name__}")
    sites = results.get("sites")
    if not isinstance(sites, dict):
        raise ConfigError(f"{path}: sites: expected {{site: {{metric: {{region: number}}}}}}")
    blocks = {f"sites.{site}": block for site, block in sites.items()}
    average = results.get("average")
    for where, block in ({"average": average} | blocks).items():
        if sites and not _metric_block(block):
            raise ConfigError(f"{path}: {where}: expected {{metric: {{region: number}}}}")
        if sites and _shape(block) != _shape(average):
            raise ConfigError(f"{path}: {where}: other metrics or regions than average")
    return results


def _shape(block: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    return {metric: set(regions) for metric, regions in block.items()}


def _metric_block(block: object) -> bool:
    """Whether ``block`` is ``{metric: {region: number or null}}``, neither empty."""
    return (
        isinstance(block, dict)
        and bool(block)
        and all(
            isinstance(regions, dict)
            and bool(regions)
            and all(v is None or isinstance(v, int | float) for v in regions.values())
            for regions in block.values()
        )
    )


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/rounds.jsonl`` ([] when the file is missing): a cut-off
    last line (a crash while appending) is skipped with a warning, as ``--resume`` does; a
    damaged line before it is a ConfigError naming the file and line."""
    return RunDir(Path(run_dir)).rounds()


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train.rounds": 20, "method.tdf": True, ...}``: nested mappings as dotted keys."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= flat_config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _manifest(run_dir: Path) -> dict[str, Any] | None:
    cfg_path = Path(run_dir) / "config.yaml"
    if not cfg_path.is_file():
        return None
    root = ((yaml.safe_load(cfg_path.read_text()) or {}).get("data") or {}).get("root")
    path = Path(str(root)) / "manifest.json" if root else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def site_facts(run_dir: Path) -> dict[str, SiteFacts]:
    """Annotation type and training-set size per site from the manifest of the run's
    federation (``data.root`` in its ``config.yaml``); {} when that folder is not readable
    here (figures then show site names only)."""
    manifest = _manifest(run_dir) or {}
    return {
        s["name"]: SiteFacts(s.get("annotation", "full"), int(s.get("splits", {}).get("train", 0)))
        for s in manifest.get("sites", [])
    }
