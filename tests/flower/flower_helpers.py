"""Helpers of the Flower tests: tiny run configs and a direct (in-process) link to the sites.

:class:`DirectLink` drives the real site handlers in this process (no Flower processes), so
the protocol, validation and fault handling are tested fast; ``test_processes.py`` runs real
``flower-superlink`` / ``flower-supernode`` processes on loopback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import RecordDict

from fedseg.config import RunConfig, parse_config
from fedseg.engine.flower.link import Reply
from fedseg.engine.flower.records import content, read_meta
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig, run_config
from fedseg.engine.flower.site import handle_evaluate, handle_hello, handle_train
from fedseg.errors import FedsegError

HANDLERS = {"hello": handle_hello, "train": handle_train, "evaluate": handle_evaluate}
SITES = ["A", "B"]


def make_config(root: Path, method: str = "fedavg", rounds: int = 2, **extra: Any) -> RunConfig:
    """A tiny run: 2 rounds, 2 local iterations, batch 4, no augmentation, CPU."""
    raw = {
        "name": f"flower-{method}",
        "seed": 3,
        "data": {"root": str(root), "labels": "weak", "sites": SITES},
        "method": {"name": method},
        "train": {
            "rounds": rounds,
            "local_iters": 2,
            "batch_size": 4,
            "augment": False,
            "lr": 1e-3,
        },
        "eval": {"batch_size": 8},
        "engine": {"device": "cpu"},
        **extra,
    }
    return parse_config(raw)


class DirectLink:
    """A :class:`~fedseg.engine.flower.link.Transport` calling the site handlers directly.

    ``down`` holds sites that do not answer; ``down_in_round[r]`` sites that do not answer
    training messages of round ``r``; ``tamper[site]`` may rewrite a site's training reply.
    """

    def __init__(self, sites: Mapping[str, SiteConfig], rc: Mapping[str, Any]) -> None:
        self.sites, self.rc = dict(sites), dict(rc)
        self.down: set[str] = set()
        self.down_in_round: dict[int, set[str]] = {}
        self.tamper: dict[str, Callable[[RecordDict], RecordDict]] = {}
        self.tamper_eval: dict[str, Callable[[RecordDict], RecordDict]] = {}
        self.sent: list[tuple[str, str]] = []

    def _call(self, kind: str, site: str, body: RecordDict) -> Reply:
        r = read_meta(body).get("round")
        if site in self.down or (kind == "train" and site in self.down_in_round.get(r, ())):  # type: ignore[arg-type]
            return "no reply within 1s"
        self.sent.append((kind, site))
        try:
            reply = HANDLERS[kind](body, _node_config(self.sites[site]), self.rc)
        except FedsegError as e:
            return f"error: {e.reason}"
        fix = (self.tamper if kind == "train" else self.tamper_eval).get(site)
        return fix(reply) if fix and kind != "hello" else reply

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        out = {}
        for name in self.sites:
            reply = self._call("hello", name, content({"run-uid": run_uid}))
            if not isinstance(reply, str):
                out[name] = read_meta(reply)
        return out

    def exchange(
        self, kind: str, bodies: Mapping[str, RecordDict], timeout: float
    ) -> dict[str, Reply]:
        return {s: self._call(kind, s, b) for s, b in bodies.items()}


def _node_config(site: SiteConfig) -> dict[str, Any]:
    nc: dict[str, Any] = {"site-name": site.name, "data-dir": str(site.data_dir)}
    if site.state_dir is not None:
        nc["state-dir"] = str(site.state_dir)
    return nc


def direct_link(
    cfg: RunConfig, root: Path, run_dir: Path, **settings: Any
) -> tuple[DirectLink, FlowerSettings]:
    """A direct link to sites A and B (state under ``run_dir/sites``) and the settings."""
    st = FlowerSettings(run_dir=run_dir, poll_interval=0.01, join_timeout=0.05, **settings)
    sites = {n: SiteConfig(n, root, run_dir / "sites" / n) for n in SITES}
    return DirectLink(sites, run_config(cfg, st)), st


def assert_same_metrics(ours: Mapping[str, Any], ref: Mapping[str, Any], tol: float) -> None:
    """Per-site ``{metric: {region: value}}`` equal within ``tol`` (NaN equals NaN)."""
    assert list(ours) == list(ref)
    for site, per in ref.items():
        for metric, regions in per.items():
            for region, v in regions.items():
                w = ours[site][metric][region]
                same = (math.isnan(v) and math.isnan(w)) or abs(w - v) <= tol
                assert same, f"{site} {metric} {region}: {w} != {v}"
