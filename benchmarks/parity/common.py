"""Shared parts of the parity drivers (``benchmarks/parity/<code>.py``; see README.md).

A driver writes a fedseg federation in another codebase's layout, runs that code (a
checkout of a pinned commit, unmodified but for the shims of ``shims/``), collects its
per-case test predictions and scores them here with fedseg's metrics on fedseg's test cases,
writing a fedseg-style run folder (``config.yaml``, ``results.json``, ``cases.csv``) that
``fedseg report`` pairs with fedseg runs case by case. Two selections are written:

- the run folder itself: the model of the last round (fedseg's rule);
- ``<run>/best_round/``: the round the code itself keeps (its best round on the test
  split), what its paper reports. A run folder of its own, so reports can read it too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedseg.data import FederatedDataset
from fedseg.data.synth import synthesize
from fedseg.data.weak import generate_weak_labels
from fedseg.engine.rundir import RunDir
from fedseg.errors import DataError
from fedseg.metrics import EMPTY_POLICY, MetricAccumulator, mean_over_sites

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "parity"
SHIMS = Path(__file__).resolve().parent / "shims"
MIRRORS = Path("/work/.mirror")
BEST = "best_round"
"""Sub-folder of a parity run holding the code's own selection (its best round on test)."""
CASE_MAP = "case_map.json"
"""File, in the layout folder, mapping the code's file names to fedseg's ``[site, case id]``."""


@dataclass(frozen=True)
class Code:
    """A pinned public codebase."""

    repository: str
    commit: str

    @property
    def mirror(self) -> Path:
        """Default git directory of a snapshot (the ``fetch`` tool's layout)."""
        return MIRRORS / self.repository.replace("/", "+") / "repo"

    def provenance(self, script: str, arguments: list[str], **extra: Any) -> dict[str, Any]:
        """The ``parity`` record of a run of ``script`` with ``arguments`` (and ``extra``)."""
        return {
            "repository": self.repository,
            "commit": self.commit,
            "script": script,
            "arguments": arguments,
            **extra,
        }


def parity_parser(doc: str, code: Code, venv: str, script: str) -> argparse.ArgumentParser:
    """The options every driver takes (run its ``code`` with ``runs/parity/<venv>``'s Python,
    ``script`` named in the help of the extra arguments); a driver adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a fedseg federation folder")
    ap.add_argument("--out", type=Path, required=True, help="the parity run folder to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--like", type=Path, help="the fedseg run (or config) it is compared with")
    ap.add_argument("--git-dir", type=Path, default=code.mirror)
    ap.add_argument("--python", default=str(RUNS / venv / "bin" / "python"))
    ap.add_argument("--work", type=Path, help="scratch folder (default runs/parity/work/...)")
    ap.add_argument("--timeout", type=float, default=86400.0, help="seconds for the run")
    ap.add_argument("extra", nargs="*", help=f"after --: more arguments for {script}")
    return ap


def parity_env(shim: str, **extra: str) -> dict[str, str]:
    """The environment of a run: ``shims/<shim>`` and ``shims/`` first on the path, one thread,
    no warnings, and ``extra``."""
    return dict(
        os.environ,
        PYTHONPATH=f"{SHIMS / shim}{os.pathsep}{SHIMS}",
        **extra,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )


def run_logged(
    cmd: list[str], cwd: Path, env: Mapping[str, str], log: Path, timeout: float
) -> float:
    """Run ``cmd`` (``[python, script, ...]``) in ``cwd``, its output into ``log``; return its
    wall time in seconds, or exit naming the log when it fails."""
    t0 = time.perf_counter()
    with log.open("wb") as out:
        rc = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        ).returncode
    if rc != 0:
        raise SystemExit(f"its {cmd[1]} exited with {rc}; see {log}")
    return time.perf_counter() - t0


def export(code: Code, git_dir: Path, dest: Path) -> Path:
    """A fresh work tree of ``code.commit`` from ``git_dir`` at ``dest`` (``git archive``)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        blob = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", code.commit],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            f"{git_dir}: cannot export {code.repository} @ {code.commit}: {e}"
        ) from None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=blob, check=True)
    return dest


def synth_federation(
    root: Path, task: str, *, sites: int, size: int, train: int, test: int, seed: int
) -> Path:
    """A small synthetic federation with weak labels (``fedseg.data.synth``), for smoke runs:
    ``train`` training and ``test`` test images per site, no validation split."""
    n = train + test
    synthesize(
        task,
        root,
        sites=sites,
        size=size,
        per_site=n,
        seed=seed,
        split=(train / n, 0.0, test / n),
        site_weights=[1.0] * sites,
        overwrite=True,
    )
    generate_weak_labels(root, seed=seed)
    return root


def write_case_map(layout: Path, mapping: Mapping[str, tuple[str, str]]) -> None:
    """Keep ``{code's file name: (site, case id)}`` beside the written layout."""
    (layout / CASE_MAP).write_text(json.dumps({k: list(v) for k, v in mapping.items()}, indent=1))


def read_case_map(layout: Path) -> dict[str, tuple[str, str]]:
    """The map :func:`write_case_map` wrote."""
    raw = json.loads((layout / CASE_MAP).read_text())
    return {k: (str(v[0]), str(v[1])) for k, v in raw.items()}


def add_predictions(
    preds: dict[str, dict[str, np.ndarray]],
    capture: Path,
    case_map: Mapping[str, tuple[str, str]],
) -> None:
    """Add a capture file's ``preds`` to ``preds`` ``{site: {case id: label map}}``, its
    ``names`` (the code's file names) mapped to ``[site, case id]`` by ``case_map``."""
    with np.load(capture) as z:
        for name, pred in zip(z["names"], z["preds"], strict=True):
            site, case = case_map[str(name)]
            preds.setdefault(site, {})[case] = pred


def score(
    fed_root: Path, predictions: Mapping[str, Mapping[str, np.ndarray]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Score ``{site: {case id: label map}}`` on the federation's test cases with fedseg's
    metrics (the manifest's regions, every metric fedseg reports, the cases' spacing), in
    fedseg's case order; a DataError names a site or case without a prediction."""
    fed = FederatedDataset.open(fed_root)
    regions = fed.manifest.regions
    per_site: dict[str, Any] = {}
    for site in (s.name for s in fed.manifest.sites):
        test = fed.load(site, "test", "full")
        got = predictions.get(site, {})
        missing = [i for i in test.ids if i not in got]
        if missing:
            raise DataError(
                f"{fed_root}: site {site!r}: no prediction for test cases {missing[:3]} "
                f"({len(missing)} of {len(test.ids)})"
            )
        acc = MetricAccumulator(regions)
        for i, cid in enumerate(test.ids):
            pred = np.asarray(got[cid]).astype(np.int64)[None]
            sp = None if test.spacing is None else [test.spacing[i]]
            acc.add(pred, test.masks[i : i + 1].numpy(), spacing=sp, ids=[cid])
        per_site[site] = acc
    return per_site, {s: a.aggregate() for s, a in per_site.items()}


class _Cases:
    """What :meth:`RunDir.write_cases` reads of a site's evaluation."""

    def __init__(self, acc: MetricAccumulator) -> None:
        self.per_case = acc.per_case


def write_run(
    out: Path,
    fed_root: Path,
    predictions: Mapping[str, Mapping[str, np.ndarray]],
    config: dict[str, Any],
    parity: dict[str, Any],
    measured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a fedseg-style run folder at ``out``: ``config.yaml`` (``config`` with the arm's
    ``parity`` block: repository, commit, command, selection rule), ``results.json`` (with
    ``parity`` and the ``measured`` facts of this run, e.g. wall time) and ``cases.csv``
    (fedseg's columns)."""
    accs, sites = score(fed_root, predictions)
    cases = {s: len(a) for s, a in accs.items()}
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "parity": parity}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    results = {
        "method": config["method"]["name"],
        "name": config["name"],
        "labels": config["data"]["labels"],
        "seed": config["seed"],
        "engine": f"parity:{parity['repository']}",
        "sites": sites,
        "average": mean_over_sites(sites),
        "weighted_average": mean_over_sites(sites, weights=cases),
        "cases": cases,
        "empty_policy": EMPTY_POLICY,
        "precision": {"amp": "off", "channels_last": False},  # every driven code: float32
        "parity": {**parity, **(measured or {})},
    }
    rd = RunDir(out)
    rd.write_results(results)
    rd.write_cases({s: _Cases(a) for s, a in accs.items()})
    return results


def arm_config(
    name: str,
    method: dict[str, Any],
    fed_root: Path,
    *,
    labels: str,
    seed: int,
    train: dict[str, Any],
    like: Path | None = None,
) -> dict[str, Any]:
    """The ``config.yaml`` of a parity arm in fedseg's shape. With ``like`` (the fedseg run
    folder or config the arm is compared with) that config, renamed, with this seed and
    federation, so that the reports see the two rows differ in the ``parity`` block only; its
    ``train`` entries that ``train`` also gives must agree (one budget for both sides). Else
    a minimal config naming ``method``, the labels and ``train``."""
    fed = {"root": str(fed_root.resolve()), "labels": labels}
    if like is None:
        return {
            "name": name,
            "seed": seed,
            "data": fed,
            "method": method,
            "train": train,
            "eval": {"split": "test"},
        }
    path = like / "config.yaml" if like.is_dir() else like
    base = yaml.safe_load(path.read_text())
    if not isinstance(base, dict) or not isinstance(base.get("train"), dict):
        raise SystemExit(f"{path}: expected a fedseg run config with a train block")
    differ = {k: (base["train"].get(k), v) for k, v in train.items() if base["train"].get(k) != v}
    if differ:
        raise SystemExit(f"{path}: train settings differ from the arm's (theirs, ours): {differ}")
    if base.get("data", {}).get("labels", labels) != labels:
        raise SystemExit(f"{path}: data.labels {base['data']['labels']!r}, the arm uses {labels!r}")
    return {**base, "name": name, "seed": seed, "data": {**base.get("data", {}), **fed}}


def write_selections(
    out: Path,
    fed_root: Path,
    last: Mapping[str, Mapping[str, np.ndarray]],
    best: Mapping[str, Mapping[str, np.ndarray]],
    config: dict[str, Any],
    parity: dict[str, Any],
    *,
    rule: str,
    measured: dict[str, Any],
) -> dict[str, Any]:
    """The two run folders of an arm: the last round at ``out`` (fedseg's rule) and the
    code's own pick (``rule``, e.g. its best round on test) at ``out/best_round``; returns
    the last round's results."""
    results = write_run(
        out, fed_root, last, config, {**parity, "selection": "last round"}, measured
    )
    write_run(
        out / BEST,
        fed_root,
        best,
        {**config, "name": f"{config['name']}-best-round"},
        {**parity, "selection": rule},
        measured,
    )
    return results


Preds = Mapping[str, Mapping[str, np.ndarray]]


def write_round_pick(
    args: argparse.Namespace,
    captures: tuple[Preds, Preds, int],
    config: dict[str, Any],
    parity: dict[str, Any],
    rule: str,
    wall: float,
) -> None:
    """:func:`write_selections` of a run of ``args.rounds`` that picks one round for all
    sites (``captures``: last, picked, the picked round from 0), and a line saying so."""
    last, best, chosen = captures
    write_selections(
        args.out,
        args.data,
        last,
        best,
        config,
        parity,
        rule=rule,
        measured={"wall_s": round(wall, 1), "chosen_round": chosen + 1},
    )
    per_round = wall / args.rounds
    print(f"{args.out}: {wall:.0f} s ({per_round:.1f} s/round); its pick: round {chosen + 1}")
