"""The round loop, written once for every engine.

:class:`RoundLoop` runs rounds and evaluations of a method over a :class:`~fedseg.engine.link.Link`:
per round it waits until enough sites are connected, sends every connected site its
payload, validates the replies, counts what travelled, and runs the server step on the valid
uploads if at least ``min_sites`` replied (otherwise the round is tried again, up to
``retries`` times, before the run stops with a resumable checkpoint). :class:`Federation`
adds the run directory: ``config.yaml``, ``rounds.jsonl``, atomic checkpoints, resume,
``results.json`` and ``cases.csv``. Tables and figures are the caller's (``fedseg.reporting``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import RunConfig, dump_config, parse_config
from fedseg.engine.device import machine, resolve_device
from fedseg.engine.link import Failure, Link, Replies
from fedseg.engine.results import build_results, communication_summary, validate_evaluation
from fedseg.engine.rundir import SAFE_RESUME_CHANGES, RunDir, config_changes
from fedseg.engine.server import ServerCore, make_method, spec_from_json, spec_to_json
from fedseg.engine.worker import EvalReply, TrainReply
from fedseg.errors import ConfigError, FedsegError, UploadError
from fedseg.methods import FederationSpec
from fedseg.methods.base import Aggregator, Payload, payload_size
from fedseg.methods.training import Precision, native_bf16
from fedseg.privacy import epsilon, privacy_report, rounds_within_budget
from fedseg.privacy.central import NoisySum
from fedseg.tracking import round_listener

__all__ = ["Federation", "RoundLoop", "RoundPolicy", "loss_summary", "wait_for_sites"]

log = logging.getLogger(__name__)
RoundCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class RoundPolicy:
    """Fault tolerance of a run (the in-process engine needs every site, no retries)."""

    min_sites: int = 0
    """Valid uploads a round needs (0: every site)."""
    retries: int = 0
    """Extra attempts of a round that got fewer than ``min_sites`` valid uploads."""
    join_timeout: float = 0.0
    """Seconds to wait for enough sites to connect."""
    poll_interval: float = 0.5

    def need(self, num_sites: int) -> int:
        return max(1, min(self.min_sites or num_sites, num_sites))


def loss_summary(clients: Mapping[str, Mapping[str, float]]) -> str:
    """Mean client loss of a round for the one-line round log."""
    losses = [m["loss"] for m in clients.values() if "loss" in m]
    return f"loss {sum(losses) / len(losses):.4f}" if losses else ""


def wait_for_sites(
    link: Link,
    run_uid: str,
    names: list[str],
    need: int,
    policy: RoundPolicy,
    *,
    strict: bool = True,
    warned: set[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Descriptions of the connected sites among ``names`` once at least ``need`` are; after
    ``policy.join_timeout`` raise (``strict``) or return those connected."""
    warned = set() if warned is None else warned
    deadline = time.monotonic() + policy.join_timeout
    while True:
        infos = link.announce(run_uid)
        strangers = sorted(set(infos) - set(names) - warned)
        if strangers:
            log.warning("ignoring sites that are not part of this run: %s", strangers)
            warned.update(strangers)
        ours = {s: infos[s] for s in names if s in infos}
        if len(ours) >= need:
            return ours
        if time.monotonic() > deadline:
            if not strict:
                return ours
            raise FedsegError(
                f"only {len(ours)} of the sites {names} are connected ({sorted(ours)}); "
                f"need {need}; gave up after {policy.join_timeout:.0f}s"
            )
        time.sleep(policy.poll_interval)


class RoundLoop:
    """Rounds and evaluations of one method over ``link`` (no files).

    ``eval_sites`` are the real sites evaluated (default: the method's sites; the pooled
    site of centralized training stands for every real site)."""

    def __init__(
        self,
        server: ServerCore,
        link: Link,
        policy: RoundPolicy,
        run_uid: str,
        eval_sites: list[str] | None = None,
    ) -> None:
        self.server, self.link, self.policy, self.run_uid = server, link, policy, run_uid
        self.eval_sites = eval_sites or server.spec.site_names
        self.secure = bool(getattr(link, "secure", False))
        """Training replies come as one SecAgg+ sum (``privacy.secure_aggregation``)."""
        self._warned: set[str] = set()

    def wait_for(self, names: list[str], need: int, strict: bool = True) -> set[str]:
        """The connected sites among ``names`` (see :func:`wait_for_sites`)."""
        found = wait_for_sites(
            self.link, self.run_uid, names, need, self.policy, strict=strict, warned=self._warned
        )
        return set(found)

    def round(self, r: int, participants: list[str] | None = None) -> dict[str, Any]:
        """One round (with retries); the record for ``rounds.jsonl``."""
        names = participants or self.server.spec.site_names
        need = self.policy.need(len(names))
        for attempt in range(self.policy.retries + 1):
            connected = self.wait_for(names, need, strict=False)
            sent = {s: self.server.payloads[s] for s in names if s in connected}
            agg = self.server.aggregator(r)
            uploaded, metrics, failures = [], {}, {}
            comm: dict[str, dict[str, Any]] = {"upload": {}, "download": {}}
            for s in names:
                if s in sent:
                    comm["download"][s] = _size(payload_size(sent[s]))
                else:
                    failures[s] = "not connected"
            if self.secure:
                uploaded = self._secure_sum(r, sent, agg, failures, comm["upload"])
            replies = () if self.secure else _in_order(self.link.train(r, sent), list(sent))
            for s, reply in self.server.screen(self._valid(r, replies, failures), failures):
                comm["upload"][s] = _size(payload_size(reply.upload))
                agg.add(s, reply.upload)
                uploaded.append(s)
                metrics[s] = reply.metrics
            if len(uploaded) >= need:
                server = self.server.finish(agg)
                return {
                    "round": r,
                    "participants": uploaded,
                    "clients": metrics,
                    "server": server,
                    "failures": {s: failures[s] for s in names if s in failures},
                    "comm": comm,
                }
            log.warning(
                "round %d attempt %d: %d valid uploads, need %d; failures: %s",
                r + 1,
                attempt + 1,
                len(uploaded),
                need,
                failures,
            )
        raise FedsegError(
            f"round {r + 1}: fewer than {need} valid uploads in {self.policy.retries + 1} "
            "attempts; the run stopped (model unchanged since the last checkpoint); fix the "
            "sites and resume the run"
        )

    def _valid(
        self,
        r: int,
        replies: Iterable[tuple[str, TrainReply | Failure]],
        failures: dict[str, Failure],
    ) -> Iterator[tuple[str, TrainReply]]:
        """The training replies whose upload passes :meth:`ServerCore.check_upload`; the
        other sites into ``failures`` with the reason."""
        for s, reply in replies:
            if isinstance(reply, Failure):
                failures[s] = reply
                continue
            try:
                if not isinstance(reply, TrainReply):
                    raise UploadError(f"site {s!r}: reply is no training reply")
                self.server.check_upload(s, reply.upload)
            except UploadError as e:
                log.warning("round %d: rejected the upload of site %r: %s", r + 1, s, e.reason)
                failures[s] = f"rejected upload: {e.reason}"
                continue
            yield s, reply

    def _secure_sum(
        self,
        r: int,
        sent: Mapping[str, Payload],
        agg: Aggregator,
        failures: dict[str, Failure],
        upload: dict[str, Any],
    ) -> list[str]:
        """Secure aggregation: ``agg`` gets the sum of the updates of the sites it covers
        (returned in site order), never one upload; the other sites of ``sent`` are
        failures; ``upload`` gets the size of each site's masked vector."""
        assert isinstance(agg, NoisySum)  # the privacy block requires mode: central
        result = self.link.train_sum(r, sent)  # type: ignore[attr-defined]
        upload.update(result.upload)
        for s in sent:
            if s not in result.sites:
                failures[s] = "not in the secure sum (dropped out, or the protocol halted)"
        if result.total is not None:
            agg.add_sum(result.total)
        return [s for s in sent if s in result.sites]

    def evaluate(
        self, r: int, split: str = "test", periodic: bool = False
    ) -> tuple[dict[str, EvalReply], dict[str, Failure]]:
        """Evaluations of the connected sites with their current payloads (in site order)
        and the failures with reasons; a malformed reply is that site's failure. A
        ``periodic`` evaluation (during training) lets sites sit it out (e.g. without a
        validation split); the final one needs at least one site and warns of failures."""
        names = self.server.spec.site_names
        connected = self.wait_for(names, 1)
        sent = {s: self.server.payloads[s] for s in names if s in connected}
        replies = self.link.evaluate(r, sent, split)
        per_site: dict[str, EvalReply] = {}
        failures: dict[str, Failure] = {}
        regions: list[str] | None = None
        for s in self.eval_sites:
            reply = replies.get(s, "not connected" if s in names and s not in sent else "no reply")
            if isinstance(reply, Failure):
                failures[s] = reply
                continue
            try:
                if not isinstance(reply, EvalReply):
                    raise UploadError(f"site {s!r}: reply is no evaluation")
                validate_evaluation(s, reply, regions)
            except UploadError as e:
                log.warning("evaluation of site %r rejected: %s", s, e.reason)
                failures[s] = f"invalid evaluation: {e.reason}"
                continue
            regions = regions or list(next(iter(reply.metrics.values())))
            per_site[s] = reply
        if periodic:
            if failures:
                log.info("periodic %s evaluation left out %s", split, failures)
            return per_site, failures
        if failures:
            log.warning("evaluation failed on %s", failures)
        if not per_site:
            raise FedsegError(f"no site could be evaluated: {failures}")
        return per_site, failures


def _in_order(replies: Replies, order: list[str]) -> Iterator[tuple[str, TrainReply | Failure]]:
    """(site, reply) for every site of ``order``, in that order: a lazy link's pairs as they
    come (each upload can be aggregated and dropped before the next site trains), a
    mapping's entries by site; a site without a reply gets the failure "no reply"."""
    if isinstance(replies, Mapping):
        for s in order:
            yield s, replies.get(s, "no reply")
        return
    seen = set()
    for s, reply in replies:
        seen.add(s)
        yield s, reply
    for s in order:
        if s not in seen:
            yield s, "no reply"


def _size(size: Mapping[str, int]) -> dict[str, int]:
    return {"values": size["values"], "bytes": size["bytes"]}


class Federation:
    """One configured run over ``link`` into the run directory ``run_dir``.

    ``order`` is the declared site order (global indices and random streams follow it).
    """

    def __init__(
        self,
        cfg: RunConfig,
        link: Link,
        run_dir: Path,
        order: list[str],
        policy: RoundPolicy | None = None,
    ) -> None:
        if len(set(order)) != len(order) or not order:
            raise ConfigError(f"site list must be non-empty without duplicates, got {order}")
        self.cfg, self.link, self.order = cfg, link, list(order)
        self.policy = policy or RoundPolicy()
        self.dir = RunDir(run_dir)
        self.loop: RoundLoop | None = None
        if cfg.privacy.secure_aggregation is not None and not getattr(link, "secure", False):
            raise ConfigError(
                "privacy.secure_aggregation runs only over Flower (fedseg flower ..., or "
                "engine.backend: flower-sim): in one process the server holds every upload"
            )

    # -- set-up ------------------------------------------------------------------------------
    def _start(self, resume: bool, overwrite: bool) -> tuple[int, list[dict[str, float]]]:
        """Create or reopen the run; returns the first round to train and past timings."""
        cfg = self.cfg
        if resume:
            ck = self.dir.load_checkpoint()
            config_now, changes = self._check_resume()
            run_uid, spec = ck["run_uid"], spec_from_json(ck["spec"])
        else:
            self.dir.prepare_new(overwrite)
            run_uid = uuid.uuid4().hex
            self.dir.create(dump_config(cfg))
            log.info("waiting for the sites %s", self.order)
            infos = wait_for_sites(self.link, run_uid, self.order, len(self.order), self.policy)
            spec = self.link.federation(self.order, infos)
        method = make_method(cfg, spec)
        self.link.bind(method, run_uid)
        server = ServerCore(method, cfg.train, cfg.seed, cfg.screening)
        self.loop = RoundLoop(server, self.link, self.policy, run_uid, list(spec.site_names))
        self.spec: FederationSpec = spec
        if not resume:
            return 0, []
        self._check_resume_precision(ck.get("precision"))
        if changes:
            log.info("resuming with changed settings %s", changes)
        self.dir.record_resume(ck["round"], config_now, changes)
        server.load_state_dict(ck["server"])
        self.link.load_state_dict(ck["sites"])
        self.dir.keep_rounds_upto(ck["round"])
        log.info("resuming run %s after round %d", run_uid, ck["round"] + 1)
        return ck["round"] + 1, list(ck["timing"])

    def _check_resume(self) -> tuple[str, dict[str, Any]]:
        """Refuse to continue with settings other than the run's, except declared-safe ones
        (more rounds, device, threads, ...); the config now and its changes, to record. A
        setting added to fedseg since the run began counts as unchanged at its default."""
        new, stored = dump_config(self.cfg), self.dir.stored_config()
        was = yaml.safe_load(dump_config(parse_config(stored, str(self.dir.config))))
        changes = config_changes(was, yaml.safe_load(new))
        unsafe = sorted(k for k in changes if k not in SAFE_RESUME_CHANGES)
        rounds = changes.get("train.rounds")
        if rounds and (not isinstance(rounds[0], int) or rounds[1] < rounds[0]):
            unsafe.append("train.rounds (only more rounds may be added)")
        if unsafe:
            shown = ", ".join(
                f"{k} {changes[k][0]!r} -> {changes[k][1]!r}" for k in unsafe if k in changes
            )
            raise ConfigError(
                f"{self.dir.path}: cannot resume with a changed config ({shown or unsafe[0]}); "
                f"a resumed run may only change {', '.join(SAFE_RESUME_CHANGES)}; start a new "
                "run with --out instead"
            )
        return new, changes

    # -- the run -----------------------------------------------------------------------------
    def run(
        self,
        resume: bool = False,
        on_round: RoundCallback | None = None,
        overwrite: bool = False,
    ) -> dict[str, Any]:
        """Train every remaining round, evaluate every site, write the results. The run
        directory is locked meanwhile; a new run needs it empty (or ``overwrite``)."""
        with self.dir.lock(), round_listener(self.cfg.tracking, self.dir.path, on_round) as hook:
            self.dir.clean_temporary()
            try:
                return self._run(resume, hook, overwrite)
            finally:
                close = getattr(self.link, "close", None)  # worker processes, if any
                if close is not None:
                    close()

    def _run(self, resume: bool, on_round: RoundCallback | None, overwrite: bool) -> dict[str, Any]:
        cfg, total = self.cfg, self.cfg.train.rounds
        last = rounds_within_budget(cfg.privacy, total)
        if last == 0:
            raise ConfigError(
                f"privacy.target_epsilon {cfg.privacy.target_epsilon:g}: already round 1's "
                f"release takes epsilon to {epsilon(cfg.privacy, 1):.3g} (delta "
                f"{cfg.privacy.delta:g}), so no round would train; raise target_epsilon or "
                "noise_multiplier"
            )
        start, timing = self._start(resume, overwrite)
        loop = self.loop
        assert loop is not None
        log.info(
            "%s | %d sites %s, %s labels, %d rounds",
            loop.server.method.summary or cfg.method_name,
            len(self.spec.sites),
            self.spec.site_names,
            cfg.data.labels,
            total,
        )
        if last < total:
            log.info(
                "privacy.target_epsilon %g: training stops after round %d of %d",
                cfg.privacy.target_epsilon,
                last,
                total,
            )
        for r in range(start, last):
            t0, c0 = time.perf_counter(), time.process_time()
            record = loop.round(r)
            self._require_finite(r)
            record["seconds"] = time.perf_counter() - t0
            record["cpu_seconds"] = time.process_time() - c0
            timing.append({"seconds": record["seconds"], "cpu_seconds": record["cpu_seconds"]})
            every = cfg.eval.every
            if every and (r + 1) % every == 0 and r + 1 < total:
                per_site, _ = loop.evaluate(total, cfg.eval.periodic_split, periodic=True)
                record["eval"] = {s: v.metrics["dsc"] for s, v in per_site.items()}
            self.dir.append_round(record)
            if r == last - 1 or (r + 1) % cfg.engine.checkpoint_every == 0:
                self._checkpoint(r, timing)
            log.info(
                "round %d/%d: %d sites %s%s, %.1fs",
                r + 1,
                total,
                len(record["participants"]),
                loss_summary(record["clients"]),
                f", failed: {record['failures']}" if record["failures"] else "",
                record["seconds"],
            )
            if on_round:
                on_round(record)
        t0, c0 = time.perf_counter(), time.process_time()
        per_site, failures = loop.evaluate(total)
        rounds = self.dir.rounds()
        results = build_results(
            cfg,
            per_site,
            params=loop.server.params,
            timing={
                "round_seconds": [t["seconds"] for t in timing],
                "round_cpu_seconds": [t["cpu_seconds"] for t in timing],
                "eval_seconds": time.perf_counter() - t0,
                "eval_cpu_seconds": time.process_time() - c0,
            },
            communication=communication_summary(rounds),
            engine=self.link.engine,
            participation=_participation(loop.server.spec.site_names, rounds),
            eval_failures=failures,
        )
        results["precision"] = self._precision
        results["machine"] = machine(resolve_device(cfg.engine.device))
        if cfg.privacy.enabled:
            results["privacy"] = privacy_report(cfg.privacy, rounds)
        self.dir.write_results(results)
        self.dir.write_cases(per_site)
        log.info("results written to %s", self.dir.results_json)
        return results

    @cached_property
    def _precision(self) -> dict[str, Any]:
        """The precision this run trains in here (``auto`` settings resolved on this device)
        and whether the device computes bf16 natively; kept in checkpoints and results."""
        assert self.loop is not None
        method, device = self.loop.server.method, resolve_device(self.cfg.engine.device)
        used = Precision(self.cfg.engine.amp, self.cfg.engine.channels_last).resolve(
            method.model_cfg, self.spec.ndim, device, method.bf16_auto
        )
        return {
            "amp": used.amp,
            "channels_last": used.channels_last,
            "native_bf16": native_bf16(device),
        }

    def _check_resume_precision(self, started: dict[str, Any] | None) -> None:
        """Refuse to continue a run in another precision than it trained in so far (an
        ``auto`` setting resolves differently on other hardware); checkpoints written before
        the precision was recorded are not checked."""
        if started is None:
            return
        here = self._precision
        changed = [k for k in ("amp", "channels_last") if started.get(k) != here[k]]
        if changed:
            was = ", ".join(f"{k} {started.get(k)!r} -> {here[k]!r}" for k in changed)
            raise ConfigError(
                f"{self.dir.path}: cannot resume here: the run trained with {was} on this "
                "machine (engine.amp/channels_last 'auto' resolve by hardware); continue it "
                "on a machine like the one it started on, or start a new run with --out"
            )

    def _require_finite(self, r: int) -> None:
        """ConfigError where round ``r`` left a non-finite model to download: it is neither
        recorded nor checkpointed, so the run resumes from the round before."""
        assert self.loop is not None
        for site, payload in self.loop.server.payloads.items():
            bad = [k for k, t in payload.tensors.items() if not bool(t.isfinite().all())]
            if bad:
                cause = (
                    "the noise of privacy.noise_multiplier * privacy.clip"
                    if self.cfg.privacy.mode == "central"
                    else "training that diverged (train.lr?)"
                )
                raise ConfigError(
                    f"round {r + 1}: the model sent to site {site!r} has non-finite values "
                    f"({bad[0]}), likely from {cause}; it is not checkpointed"
                )

    def _checkpoint(self, r: int, timing: list[dict[str, float]]) -> None:
        loop = self.loop
        assert loop is not None
        self.dir.save_checkpoint(
            {
                "round": r,
                "timing": timing,
                "precision": self._precision,
                "run_uid": loop.run_uid,
                "spec": spec_to_json(self.spec),
                "server": loop.server.state_dict(),
                "sites": self.link.state_dict(),
            }
        )


def _participation(names: list[str], rounds: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(names, 0)
    for rec in rounds:
        for s in rec.get("participants", []):
            counts[s] = counts.get(s, 0) + 1
    return counts
