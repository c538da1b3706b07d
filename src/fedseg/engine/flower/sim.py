"""``engine.backend: flower-sim``: a run on Flower's Ray-based simulation engine.

The round loop is the one of every engine (:class:`~fedseg.engine.flower.link.FlowerLink`
over :class:`~fedseg.engine.flower.server_app.GridLink`), driven by a ``ServerApp`` on the
simulation's in-memory Grid; every site is a virtual SuperNode whose messages the same site
handlers answer (:mod:`~fedseg.engine.flower.site`) in Ray actors, each reserving the
configured CPUs and GPU fraction, so as many sites train at once as the resources allow. A
site keeps its private state in ``RUN_DIR/sites/<site>/`` (as a Flower site does on its
disk), every random stream follows (seed, round, site index): the results equal those of the
in-process engine for the same config and seed (with the same ``engine.threads``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedseg.backends import SimSettings
from fedseg.config import RunConfig
from fedseg.data import FederatedDataset
from fedseg.engine.flower.client_app import build_client_app
from fedseg.engine.flower.link import run_federation
from fedseg.engine.flower.server_app import GridLink
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig, run_config
from fedseg.engine.loop import RoundCallback
from fedseg.engine.prepare import prepare_data
from fedseg.errors import FedsegError

__all__ = ["backend_config", "run_on_flower_sim"]

log = logging.getLogger(__name__)

POLL = 0.05
"""Seconds between the ServerApp's polls for replies (in memory: cheap)."""


def backend_config(sim: SimSettings) -> dict[str, Any]:
    """Flower's Ray backend configuration for ``sim``: per-site resources, the cluster."""
    init: dict[str, Any] = {"address": sim.ray_address} if sim.ray_address else {}
    return {
        "client_resources": {"num_cpus": sim.cpus, "num_gpus": sim.gpus},
        "init_args": init,
    }


def _client_app(sites: list[SiteConfig], rc: Mapping[str, Any]) -> ClientApp:
    """A ClientApp whose virtual node ``partition-id`` i is site ``sites[i]``."""

    def configs_of(context: Context) -> tuple[dict[str, Any], Mapping[str, Any]]:
        site = sites[int(context.node_config["partition-id"])]
        node = {"site-name": site.name, "data-dir": str(site.data_dir)}
        node |= {"state-dir": str(site.state_dir), "threads": site.threads}
        return node, rc

    return build_client_app(configs_of)


def run_on_flower_sim(
    cfg: RunConfig,
    run_dir: Path,
    sim: SimSettings,
    resume: bool = False,
    on_round: RoundCallback | None = None,
) -> dict[str, Any]:
    """Run (or resume) ``cfg`` with its sites on Flower's simulation engine into ``run_dir``;
    returns ``results.json``'s content."""
    import ray

    root = prepare_data(cfg).resolve()
    order = list(cfg.data.sites or FederatedDataset.open(root).site_names)
    run_dir = Path(run_dir).resolve()
    settings = FlowerSettings(
        run_dir=run_dir,
        resume=resume,
        sites=tuple(order),
        min_sites=len(order),
        retries=0,
        join_timeout=600.0,
        poll_interval=POLL,
        reuse_payloads=False,  # any Ray actor may answer a site's next message
    )
    sites = [SiteConfig(n, root, run_dir / "sites" / n, threads=cfg.engine.threads) for n in order]
    out: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        link = GridLink(grid, POLL)
        out["results"] = run_federation(cfg, settings, link, engine="flower-sim", on_round=on_round)

    log.info(
        "Flower simulation: %d sites, %.3g CPUs and %.3g GPUs per site, Ray %s",
        len(order),
        sim.cpus,
        sim.gpus,
        sim.ray_address or "started locally",
    )
    try:
        run_simulation(
            server_app=server,
            client_app=_client_app(sites, run_config(cfg, settings)),
            num_supernodes=len(order),
            backend_config=backend_config(sim),  # type: ignore[arg-type]
        )
    finally:
        if ray.is_initialized():
            ray.shutdown()
    if "results" not in out:
        raise FedsegError(f"the Flower simulation ended without results; see {run_dir}")
    return out["results"]
