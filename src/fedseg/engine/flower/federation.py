"""The server's round loop of a multi-site run, over any transport (a :class:`Link`).

Per round: wait until enough sites are connected, send every connected site its payload,
collect replies until the round timeout, validate them, and run the server step on the valid
uploads if at least ``min_sites`` replied; otherwise nothing changes and the round is tried
again (up to ``retries`` times) before the run stops with a resumable checkpoint. Each round
is written to ``rounds.jsonl`` with its participants and failures, the run directory gets the
same files as an in-process run (``config.yaml``, ``rounds.jsonl``, ``checkpoints/last.pt``,
``results.json``, ``results.md``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from flwr.app import RecordDict

from fedseg.config import RunConfig, dump_config
from fedseg.engine.flower.coordinator import Coordinator, Reply, build_spec
from fedseg.engine.flower.records import spec_from_json
from fedseg.engine.flower.settings import FlowerSettings
from fedseg.engine.flower.site import fedseg_version
from fedseg.engine.rundir import RunDir, atomic_write_bytes
from fedseg.engine.runner import loss_summary
from fedseg.errors import ConfigError, FedsegError
from fedseg.metrics import EMPTY_POLICY
from fedseg.reporting.results import build_results, site_table

__all__ = ["FederationServer", "Link", "site_order"]

log = logging.getLogger(__name__)


class Link(Protocol):
    """How the server reaches the sites (Flower's Grid in deployment, direct calls in tests)."""

    def announce(self, run_uid: str) -> dict[str, dict[str, Any]]:
        """Connected sites and their self-descriptions, ``{site name: description}``."""
        ...

    def exchange(
        self, kind: str, bodies: Mapping[str, RecordDict], timeout: float
    ) -> dict[str, Reply]:
        """Send ``bodies[site]`` to each site (``kind``: ``train`` or ``evaluate``); return the
        reply of every site, or why there is none."""
        ...


def site_order(cfg: RunConfig, settings: FlowerSettings) -> list[str]:
    """The declared sites in global-index order: ``--sites``, else ``data.sites``."""
    order = list(settings.sites or cfg.data.sites or [])
    if not order:
        raise ConfigError(
            "a Flower run needs its sites declared: set data.sites in the config or pass "
            "--sites A,B,... (their order fixes each site's index and random streams)"
        )
    if len(set(order)) != len(order):
        raise ConfigError(f"site list has duplicates: {order}")
    return order


class FederationServer:
    """Runs one configured experiment over ``link`` into ``settings.run_dir``."""

    def __init__(self, cfg: RunConfig, settings: FlowerSettings, link: Link) -> None:
        self.cfg, self.settings, self.link = cfg, settings, link
        self.dir = RunDir(settings.run_dir)
        self.coord: Coordinator | None = None
        self.version = fedseg_version()
        self._warned: set[str] = set()

    # -- connection --------------------------------------------------------------------------
    def wait_for(
        self, order: list[str], need: int, run_uid: str, strict: bool = True
    ) -> dict[str, dict[str, Any]]:
        """Descriptions of the connected sites among ``order`` once at least ``need`` are;
        after ``join_timeout`` raise (``strict``) or return those connected."""
        deadline = time.monotonic() + self.settings.join_timeout
        warned = self._warned
        while True:
            infos = self.link.announce(run_uid)
            strangers = sorted(set(infos) - set(order) - warned)
            if strangers:
                log.warning("ignoring sites that are not part of this run: %s", strangers)
                warned.update(strangers)
            ours = {s: infos[s] for s in order if s in infos}
            for s, info in ours.items():
                theirs = info.get("fedseg-version")
                if theirs != self.version and s not in warned:
                    log.warning("site %r runs fedseg %s, the server %s", s, theirs, self.version)
                    warned.add(s)
            if len(ours) >= need:
                return ours
            if time.monotonic() > deadline:
                if not strict:
                    return ours
                raise FedsegError(
                    f"only {len(ours)} of the sites {order} are connected ({sorted(ours)}); "
                    f"need {need}; gave up after {self.settings.join_timeout:.0f}s"
                )
            time.sleep(self.settings.poll_interval)

    # -- the run -----------------------------------------------------------------------------
    def start(self) -> tuple[int, list[float]]:
        """Create or reopen the run; returns the first round to train and past round times."""
        cfg, st = self.cfg, self.settings
        keep = cfg.engine.checkpoint_every + 1
        if st.resume:
            if not self.dir.checkpoint.exists():
                raise ConfigError(f"{self.dir.path}: no checkpoint to resume from")
            ck = self.dir.load_checkpoint(torch.device("cpu"))
            self.coord = Coordinator(cfg, spec_from_json(ck["spec"]), ck["run_uid"], keep)
            self.coord.load_state_dict(ck)
            self.dir.keep_rounds_upto(ck["round"])
            log.info("resuming run %s after round %d", ck["run_uid"], ck["round"] + 1)
            return ck["round"] + 1, list(ck["round_seconds"])
        order = site_order(cfg, st)
        run_uid = uuid.uuid4().hex
        self.dir.create(dump_config(cfg))
        log.info("waiting for the sites %s", order)
        infos = self.wait_for(order, len(order), run_uid)
        self.coord = Coordinator(cfg, build_spec(cfg, order, infos), run_uid, keep)
        meta = {"engine": "flower", "run_uid": run_uid, "sites": order}
        atomic_write_bytes(self.dir.path / "flower.json", json.dumps(meta, indent=2).encode())
        return 0, []

    def run(self) -> dict[str, Any]:
        """Train every remaining round, evaluate every site, write the results."""
        start, round_seconds = self.start()
        assert self.coord is not None
        cfg, total = self.cfg, self.cfg.train.rounds
        log.info(
            "%s | %d sites %s, %s labels, %d rounds, min. %d valid uploads per round",
            self.coord.method.summary or cfg.method_name,
            len(self.coord.spec.sites),
            self.coord.spec.site_names,
            cfg.data.labels,
            total,
            self.settings.min_replies(len(self.coord.spec.sites)),
        )
        for r in range(start, total):
            t0 = time.perf_counter()
            record = self.round(r)
            record["seconds"] = time.perf_counter() - t0
            round_seconds.append(record["seconds"])
            every = cfg.eval.every
            if every and (r + 1) % every == 0 and r + 1 < total:
                per_site, _ = self.evaluate()
                record["eval"] = {s: v["metrics"]["dsc"] for s, v in per_site.items()}
            self.dir.append_round(record)
            if r == total - 1 or (r + 1) % cfg.engine.checkpoint_every == 0:
                ck = {**self.coord.state_dict(), "round": r, "round_seconds": round_seconds}
                self.dir.save_checkpoint(ck)
            log.info(
                "round %d/%d: %d sites %s%s, %.1fs",
                r + 1,
                total,
                len(record["participants"]),
                loss_summary(record["clients"]),
                f", failed: {record['failures']}" if record["failures"] else "",
                record["seconds"],
            )
        t0 = time.perf_counter()
        per_site, failures = self.evaluate()
        results = build_results(
            cfg,
            per_site,
            params=self.coord.params,
            timing={"round_seconds": round_seconds, "eval_seconds": time.perf_counter() - t0},
            empty_policy=EMPTY_POLICY,
        )
        results["engine"] = "flower"
        results["participation"] = self.participation()
        if failures:
            results["eval_failures"] = failures
        self.dir.write_results(results, site_table(results))
        log.info("results written to %s", self.dir.results_json)
        return results

    def round(self, r: int) -> dict[str, Any]:
        """One round with retries; the record for ``rounds.jsonl``."""
        coord, st = self.coord, self.settings
        assert coord is not None
        names = coord.spec.site_names
        need = st.min_replies(len(names))
        for attempt in range(st.retries + 1):
            infos = self.wait_for(names, need, coord.run_uid, strict=False)
            bodies = {s: coord.body(s, r) for s in names if s in infos}
            replies = self.link.exchange("train", bodies, st.round_timeout)
            uploads, metrics, failures = coord.collect(r, replies)
            for s in names:
                if s not in bodies:
                    failures[s] = "not connected"
            if len(uploads) >= need:
                server = coord.step(r, uploads)
                return {
                    "round": r,
                    "participants": list(uploads),
                    "clients": metrics,
                    "server": server,
                    "failures": failures,
                }
            log.warning(
                "round %d attempt %d: %d valid uploads, need %d; failures: %s",
                r + 1,
                attempt + 1,
                len(uploads),
                need,
                failures,
            )
        raise FedsegError(
            f"round {r + 1}: fewer than {need} valid uploads in {st.retries + 1} attempts; the "
            f"run stopped (model unchanged since the last checkpoint); fix the sites and "
            f"resume with `fedseg flower ... --resume {self.dir.path}`"
        )

    def evaluate(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Evaluations of the connected sites with their current payloads."""
        coord = self.coord
        assert coord is not None
        infos = self.wait_for(coord.spec.site_names, 1, coord.run_uid)
        r = self.cfg.train.rounds
        bodies = {s: coord.body(s, r) for s in coord.spec.site_names if s in infos}
        per_site, failures = coord.evaluations(
            self.link.exchange("evaluate", bodies, self.settings.round_timeout)
        )
        failures.update({s: "not connected" for s in coord.spec.site_names if s not in bodies})
        if failures:
            log.warning("evaluation failed on %s", failures)
        if not per_site:
            raise FedsegError(f"no site could be evaluated: {failures}")
        return per_site, failures

    def participation(self) -> dict[str, int]:
        """Rounds each site took part in (from ``rounds.jsonl``)."""
        assert self.coord is not None
        counts = dict.fromkeys(self.coord.spec.site_names, 0)
        for rec in self.dir.rounds():
            for s in rec.get("participants", []):
                counts[s] = counts.get(s, 0) + 1
        return counts
