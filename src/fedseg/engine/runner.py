"""The in-process engine: a config, its data in memory, the round loop, a run directory."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedseg.backends import sim_settings
from fedseg.config import RunConfig
from fedseg.data import FederatedDataset
from fedseg.engine.device import resolve_device
from fedseg.engine.loop import Federation, RoundCallback, loss_summary
from fedseg.engine.pool import in_memory_link
from fedseg.engine.prepare import prepare_data
from fedseg.engine.rundir import RunDir
from fedseg.engine.sites import load_sites
from fedseg.methods.training import Precision

__all__ = ["InProcessRunner", "loss_summary", "site_state_settings"]

log = logging.getLogger(__name__)


def site_state_settings(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Where the in-process link keeps the sites' private states for ``cfg`` in ``run_dir``
    (``engine.site_states``): ``state_root`` (None: in memory) and ``keep``."""
    disk = cfg.engine.site_states == "disk"
    return {
        "state_root": run_dir / "sites" if disk else None,
        "keep": cfg.engine.checkpoint_every + 1,
    }


class InProcessRunner:
    """Runs a :class:`RunConfig` to completion with every site in this process, writing
    everything into ``run_dir``."""

    def __init__(self, cfg: RunConfig, run_dir: Path, keep_eval_models: bool = False) -> None:
        """``keep_eval_models``: keep the models of the final evaluation
        (:attr:`eval_models`; sites trained in this process, states in memory)."""
        self.cfg = cfg
        self.dir = RunDir(run_dir)
        self.device = resolve_device(cfg.engine.device)
        self.keep_eval_models = keep_eval_models
        self.eval_models: dict[str, nn.Module] = {}
        """After :meth:`run` with ``keep_eval_models``: per site, a CPU copy of the model
        the final evaluation scored (empty where sites ran in other processes)."""
        if cfg.engine.threads:
            torch.set_num_threads(cfg.engine.threads)

    def run(self, resume: bool = False, on_round: RoundCallback | None = None) -> dict[str, Any]:
        """Train all rounds (after the last checkpointed one when resuming) and evaluate;
        with ``engine.backend: flower-sim`` on Flower's simulation engine."""
        cfg = self.cfg
        sim = sim_settings(cfg.engine.backend)
        if sim is not None:
            from fedseg.engine.flower.sim import run_on_flower_sim

            return run_on_flower_sim(cfg, self.dir.path, sim, resume, on_round)
        fed = FederatedDataset.open(prepare_data(cfg))
        spec, sites = load_sites(
            fed, cfg.data.labels, cfg.data.sites, cfg.eval.split, lazy=cfg.data.lazy
        )
        link = in_memory_link(
            spec,
            sites,
            fed.manifest.regions,
            train=cfg.train,
            seed=cfg.seed,
            device=self.device,
            eval_batch_size=cfg.eval.batch_size,
            workers=cfg.engine.workers,
            threads=cfg.engine.threads,
            precision=Precision(cfg.engine.amp, cfg.engine.channels_last),
            # with states on disk memory is kept free: the export builds the models again
            keep_eval_models=self.keep_eval_models and cfg.engine.site_states == "memory",
            **site_state_settings(cfg, self.dir.path),
        )
        results = Federation(cfg, link, self.dir.path, spec.site_names).run(resume, on_round)
        self.eval_models = link.eval_models
        return results
