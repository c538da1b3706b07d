"""The in-process engine: a config and a run directory around :class:`Simulation`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedseg.config import RunConfig, dump_config, method_config
from fedseg.data import FederatedDataset
from fedseg.engine.prepare import prepare_data
from fedseg.engine.rundir import RunDir
from fedseg.engine.simulation import Simulation
from fedseg.engine.sites import load_sites
from fedseg.errors import ConfigError
from fedseg.methods import get_method
from fedseg.metrics import EMPTY_POLICY
from fedseg.reporting.plots import render_run_plots
from fedseg.reporting.results import build_results, site_table

__all__ = ["InProcessRunner", "loss_summary", "resolve_device"]

log = logging.getLogger(__name__)
RoundCallback = Callable[[dict[str, Any]], None]


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available; anything else is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class InProcessRunner:
    """Runs a :class:`RunConfig` to completion, writing everything into ``run_dir``."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.dir = RunDir(run_dir)
        self.device = resolve_device(cfg.engine.device)
        if cfg.engine.threads:
            torch.set_num_threads(cfg.engine.threads)

    def setup(self) -> Simulation:
        """Load (or synthesize) the data and build the method and its simulation."""
        cfg = self.cfg
        fed = FederatedDataset.open(prepare_data(cfg))
        self.regions = fed.manifest.regions
        spec, sites = load_sites(fed, cfg.data.labels, cfg.data.sites, cfg.eval.split)
        cls = get_method(cfg.method_name)
        method = cls(method_config(cfg.method), Simulation.method_spec(cls, spec, sites))
        log.info(
            "%s | %d sites, %s labels, %d rounds",
            method.summary or cfg.method_name,
            len(sites),
            cfg.data.labels,
            cfg.train.rounds,
        )
        return Simulation(method, sites, cfg.train, seed=cfg.seed, device=self.device)

    def run(self, resume: bool = False, on_round: RoundCallback | None = None) -> dict[str, Any]:
        """Train all rounds (after the last checkpointed one when resuming) and evaluate."""
        sim = self.setup()
        start, round_seconds = 0, []
        if resume:
            if not self.dir.checkpoint.exists():
                raise ConfigError(f"{self.dir.path}: no checkpoint to resume from")
            ck = self.dir.load_checkpoint(self.device)
            sim.load_state_dict(ck)
            self.dir.keep_rounds_upto(ck["round"])
            start, round_seconds = ck["round"] + 1, list(ck["round_seconds"])
            log.info("resuming after round %d", start)
        else:
            self.dir.create(dump_config(self.cfg))
        total = self.cfg.train.rounds
        for r in range(start, total):
            t0 = time.perf_counter()
            record = sim.round(r)
            record["seconds"] = time.perf_counter() - t0
            round_seconds.append(record["seconds"])
            every = self.cfg.eval.every
            if every and (r + 1) % every == 0 and r + 1 < total:
                ev = sim.evaluate(self.regions, self.cfg.eval.batch_size)
                record["eval"] = {s: v["metrics"]["dsc"] for s, v in ev.items()}
            self.dir.append_round(record)
            if r == total - 1 or (r + 1) % self.cfg.engine.checkpoint_every == 0:
                self.dir.save_checkpoint(
                    {**sim.state_dict(), "round": r, "round_seconds": round_seconds}
                )
            log.info(
                "round %d/%d %s %.1fs",
                r + 1,
                total,
                loss_summary(record["clients"]),
                record["seconds"],
            )
            if on_round:
                on_round(record)
        t0 = time.perf_counter()
        per_site = sim.evaluate(self.regions, self.cfg.eval.batch_size)
        results = build_results(
            self.cfg,
            per_site,
            params=sim.params,
            timing={"round_seconds": round_seconds, "eval_seconds": time.perf_counter() - t0},
            empty_policy=EMPTY_POLICY,
        )
        self.dir.write_results(results, site_table(results))
        for fig in render_run_plots(self.dir.path):
            log.info("wrote %s", fig)
        return results


def loss_summary(clients: dict[str, dict[str, float]]) -> str:
    """Mean client loss of a round for the one-line round log (both engines)."""
    losses = [m["loss"] for m in clients.values() if "loss" in m]
    return f"loss {sum(losses) / len(losses):.4f}" if losses else ""
