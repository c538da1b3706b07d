"""The runs behind a table: when a kept run counts as done, how a run is made and kept, and
how a list of runs executes, one after another or in worker processes (``--jobs``)."""

from __future__ import annotations

import copy
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedseg.config import RunConfig, parse_config
from fedseg.engine.device import resolve_device
from fedseg.engine.rundir import RunDir, config_changes
from fedseg.errors import ConfigError
from fedseg.methods.training import native_bf16
from fedseg.reporting.runs import read_results
from fedseg.reporting.stats import read_cases

__all__ = [
    "KEPT_FILES",
    "RESULT_NEUTRAL_ENGINE",
    "Finished",
    "Job",
    "finished_run",
    "interrupted_run",
    "keep_run",
    "kept_difference",
    "predates_synth_seed",
    "require_readable",
    "run_config",
    "run_jobs",
    "stored_config",
]

KEPT_FILES = ("config.yaml", "results.json", "cases.csv", "rounds.jsonl")
"""The small files of a finished run copied to an evidence folder (no checkpoints, models)."""

RESULT_NEUTRAL_ENGINE = (
    "device",
    "checkpoint_every",
    "threads",
    "workers",
    "site_states",
    "backend",
)
"""Engine settings that do not change a run's numbers beyond float rounding (the engines and
worker counts give the same results, docs/architecture.md); ``engine.amp`` and
``engine.channels_last`` do change them (precision; dropout masks follow the memory layout)."""


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    d = cfg.model_dump(mode="json")
    d.pop("name")  # a label: two configs that differ only in it train the same run
    for key in RESULT_NEUTRAL_ENGINE:
        d["engine"].pop(key, None)
    return d


def _dumped_config(run_dir: Path) -> RunConfig | None:
    """The config a run in ``run_dir`` was started with, or None where it has none or it no
    longer parses."""
    rd = RunDir(run_dir)
    if not rd.config.is_file():
        return None
    try:
        return parse_config(rd.stored_config(), str(rd.config))
    except ConfigError:
        return None


def stored_config(run_dir: Path) -> RunConfig | None:
    """The config of the finished run in ``run_dir`` (its ``config.yaml`` beside a
    ``results.json``), or None where there is none or it no longer parses."""
    return _dumped_config(run_dir) if (run_dir / "results.json").is_file() else None


def finished_run(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a finished run of ``cfg``: its results, cases and a config
    that resolves to the same settings (a setting added since, at its default, still
    matches; a changed default does not, where the run recorded it: method settings are
    recorded with their defaults since 2026-11-28; the run's ``name`` and engine settings
    that leave the numbers unchanged, :data:`RESULT_NEUTRAL_ENGINE`, are not compared).
    Under ``engine.amp: auto`` the run must also have been made on hardware that, like this
    one, does (or does not) compute bf16 natively: ``auto`` resolves differently there."""
    if not (run_dir / "cases.csv").is_file():
        return False
    stored = stored_config(run_dir)
    if stored is None or _comparable(stored) != _comparable(cfg):
        return False
    try:
        used = read_results(run_dir / "results.json").get("precision")
    except ConfigError:
        return False
    return _same_bf16_hardware(used, cfg)


def kept_difference(kept: Path, cfg: RunConfig) -> str | None:
    """Why the finished run kept in ``kept`` is not one of ``cfg`` (the first setting that
    differs, e.g. a default changed since, or the bf16 hardware of ``engine.amp: auto``), or
    None where it is one or ``kept`` holds no finished run."""
    stored = stored_config(kept)
    if stored is None or finished_run(kept, cfg):
        return None
    changes = config_changes(_comparable(stored), _comparable(cfg))
    if changes:
        key, (was, now) = next(iter(changes.items()))
        return f"{key}={was!r}, this run has {now!r}"
    return "it was made on hardware that computes bf16 otherwise (engine.amp: auto resolves apart)"


def require_readable(kept: Path) -> None:
    """ConfigError naming the file where ``kept`` holds (some of) a kept run's
    :data:`KEPT_FILES` that cannot be read: one missing, cut off or damaged, or a
    ``config.yaml`` that no longer parses. Such a run is never replaced unasked (``--rerun``)."""
    present = [name for name in KEPT_FILES if (kept / name).is_file()]
    if not present:
        return
    rd = RunDir(kept)
    try:
        missing = [name for name in KEPT_FILES if name not in present]
        if missing:
            raise ConfigError(f"{kept / missing[0]}: missing beside {', '.join(present)}")
        parse_config(rd.stored_config(), str(rd.config))
        read_results(rd.results_json)
        read_cases(rd.cases_csv)
        rd.rounds()
    except ConfigError as e:
        raise ConfigError(
            f"a kept run cannot be read: {e.reason}; restore its files (e.g. `git checkout "
            f"-- {kept}`) or pass --rerun to train it again and replace them"
        ) from None


def _same_bf16_hardware(used: dict[str, Any] | None, cfg: RunConfig) -> bool:
    """Whether a run that recorded ``used`` (its ``precision``) resolves ``engine.amp: auto``
    as ``cfg`` does here: made on hardware that, like this one, does (or does not) compute
    bf16 natively. Always true for an explicit ``engine.amp``."""
    if cfg.engine.amp != "auto":
        return True
    return (used or {}).get("native_bf16") == native_bf16(resolve_device(cfg.engine.device))


def interrupted_run(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds an unfinished run of ``cfg`` (same settings and bf16
    hardware, as :func:`finished_run` compares them) with a checkpoint to continue from; a
    checkpoint written before precision was recorded in it counts as the same hardware."""
    rd = RunDir(run_dir)
    if not (rd.checkpoint.is_file() or rd.previous.is_file()):
        return False
    started = _dumped_config(run_dir)
    if started is None or _comparable(started) != _comparable(cfg):
        return False
    try:
        used = rd.load_checkpoint().get("precision", {"native_bf16": None})
    except ConfigError:
        return False
    return used["native_bf16"] is None or _same_bf16_hardware(used, cfg)


def predates_synth_seed(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a run of synthesized data started before runs recorded
    ``data.synth.seed`` (2026-11-29). Such a run drew a missing federation with its own
    seed, or used whichever one an earlier run had drawn, so which images it saw is not
    known from its files (docs/data.md, "In a run config")."""
    rd = RunDir(run_dir)
    if cfg.data.synth is None or not rd.config.is_file():
        return False
    try:  # the file as written: reading it as a config fills in the default
        raw = yaml.safe_load(rd.config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    synth = (raw.get("data") or {}).get("synth") if isinstance(raw, dict) else None
    return isinstance(synth, dict) and "seed" not in synth


def run_config(
    raw: dict[str, Any], run_dir: Path, source: str = "<config>", rerun: bool = False
) -> dict[str, Any]:
    """Run ``raw`` in-process into ``run_dir`` (results.md and figures included) and return
    its results; a finished run there with the same config is reused, an interrupted one
    (a session that ended mid-run) continues from its last checkpoint, which gives the
    numbers an uninterrupted run gives. A run there that :func:`predates_synth_seed` is
    neither reused nor continued, nor any with ``rerun``: it is trained afresh."""
    from fedseg.engine.runner import InProcessRunner
    from fedseg.outputs import write_run_outputs

    cfg = parse_config(raw, source)
    fresh = rerun or predates_synth_seed(run_dir, cfg)
    if not fresh and finished_run(run_dir, cfg):
        return read_results(run_dir / "results.json")
    resume = not fresh and interrupted_run(run_dir, cfg)
    if not resume:
        RunDir(run_dir).prepare_new(overwrite=True)
    results = InProcessRunner(cfg, run_dir).run(resume=resume)
    write_run_outputs(run_dir, results)
    return results


def keep_run(run_dir: Path, store: Path) -> None:
    """Copy the small files of a finished run (:data:`KEPT_FILES`) to ``store``."""
    store.mkdir(parents=True, exist_ok=True)
    for name in KEPT_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, store / name)


@dataclass(frozen=True)
class Job:
    """One run of a table: its raw config and the file it came from, the folder it runs in,
    the folder its small files are kept in (None: not kept), and whether it is trained
    afresh even where a finished run of it is there or kept (``--rerun``)."""

    raw: dict[str, Any]
    source: str
    run_dir: Path
    kept: Path | None = None
    rerun: bool = False

    def config(self) -> RunConfig:
        return parse_config(copy.deepcopy(self.raw), self.source)


@dataclass(frozen=True)
class Finished:
    """A job's outcome: its index in the list, results, the folder holding the run, and the
    wall seconds it took (0 where a kept run was reused)."""

    index: int
    results: dict[str, Any]
    run_dir: Path
    seconds: float
    reused: bool


def _execute(job: Job, threads: int = 0) -> tuple[dict[str, Any], float]:
    """Run ``job`` (with ``threads`` torch threads when > 0) and keep it; its results and
    wall seconds."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    results = run_config(job.raw, job.run_dir, job.source, job.rerun)
    if job.kept is not None:
        keep_run(job.run_dir, job.kept)
    return results, time.perf_counter() - t0


def worker_threads(workers: int, cfg: RunConfig) -> int:
    """Torch threads per worker process: the config's ``engine.threads``, else 0 (torch's
    default) where ``OMP_NUM_THREADS`` is set, else an equal share of the CPU's cores."""
    if cfg.engine.threads or "OMP_NUM_THREADS" in os.environ:
        return 0
    return max(1, (os.cpu_count() or 1) // workers)


def run_jobs(jobs: Sequence[Job], workers: int = 1) -> Iterator[Finished]:
    """Each job's outcome: a job whose kept folder holds a finished run of its config is read
    from there first; the others run in order in this process (``workers`` 1) or in
    ``workers`` spawned processes, yielded as they finish. Synthetic federations are built
    here first, in job order, so no two workers build one folder and the data are those a
    run in order would build. A failing run stops the rest (finished runs stay kept)."""
    if workers < 1:
        raise ConfigError(f"--jobs {workers}: must be at least 1")
    pending, configs = [], [job.config() for job in jobs]
    for i, job in enumerate(jobs):
        if job.kept is not None and not job.rerun and finished_run(job.kept, configs[i]):
            results = read_results(job.kept / "results.json")
            yield Finished(i, results, job.kept, 0.0, True)
        else:
            pending.append(i)
    if workers == 1 or len(pending) < 2:
        for i in pending:
            results, seconds = _execute(jobs[i])
            yield Finished(i, results, jobs[i].run_dir, seconds, False)
        return
    from fedseg.engine.prepare import prepare_data

    for i in pending:
        prepare_data(configs[i])
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(pending)), mp_context=context) as pool:
        running: dict[Future, int] = {
            pool.submit(_execute, jobs[i], worker_threads(workers, configs[i])): i for i in pending
        }
        try:
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    results, seconds = future.result()
                    yield Finished(i, results, jobs[i].run_dir, seconds, False)
        except BaseException:
            for future in running:
                future.cancel()
            raise
