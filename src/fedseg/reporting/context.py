"""How a report's runs were trained, and which distances are not distances.

The context of a run: rounds x local steps (or epochs), labels and each site's annotation
type, precision, seeds and the unit of its distances. A missed region (an empty prediction
or an empty target) scores HD95, HD and ASSD as the image diagonal (``EMPTY_POLICY``,
docs/metrics.md), a number larger than any real distance that dominates a mean: the cells
and bars it enters are marked with :data:`MISSED_MARK`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedseg.data.federation import sample_dir
from fedseg.data.manifest import read_manifest
from fedseg.errors import FedsegError
from fedseg.reporting.runs import site_facts
from fedseg.reporting.stats import read_cases
from fedseg.run_table import DISTANCES

if TYPE_CHECKING:
    from fedseg.reporting.runs import Run

__all__ = [
    "MISSED_MARK",
    "MISSED_NOTE",
    "distance_unit",
    "marked",
    "missed_regions",
    "run_context",
    "seeds_phrase",
]

MISSED_MARK = "†"
MISSED_NOTE = (
    f"{MISSED_MARK} no prediction (or no target) in at least one test case: its HD95 (HD, "
    "ASSD) is set to the image diagonal"
)
_PRECISION = {"off": "float32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}


def seeds_phrase(seeds: Sequence[Any]) -> str:
    """``seed 0`` for one run, ``3 seeds (0, 1, 2)`` for several."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return f"{len(seeds)} seeds ({', '.join(str(s) for s in seeds)})"


def _schedule(cfg: dict[str, Any]) -> str:
    train = cfg.get("train") or {}
    rounds = train.get("rounds")
    if rounds is None:
        return "rounds not recorded"
    if train.get("local_epochs"):
        return f"{rounds} rounds × {train['local_epochs']} local epochs"
    if train.get("local_iters"):
        return f"{rounds} rounds × {train['local_iters']} local steps"
    return f"{rounds} rounds"


def _labels(run: Run) -> str:
    labels = run.results.get("labels") or (run.config.get("data") or {}).get("labels")
    if labels != "weak":
        return f"{labels or 'full'} labels"
    facts = site_facts(run.dir)
    sites = [s for s in run.results["sites"] if s in facts]
    shown = ", ".join(f"{s} {facts[s].annotation}" for s in sites)
    return f"weak labels ({shown})" if shown else "weak labels"


def _precision(results: dict[str, Any]) -> str:
    amp = (results.get("precision") or {}).get("amp")
    return _PRECISION.get(amp, f"{amp} autocast") if amp else "precision not recorded"


def _root(run: Run) -> Path | None:
    root = (run.config.get("data") or {}).get("root")
    return Path(str(root)) if root else None


@cache
def _test_diagonals(root: Path, site: str) -> dict[str, float]:
    """Each test case's image diagonal (spacing-weighted where the sample carries spacing);
    {} when the federation is not readable here."""
    try:
        shape = read_manifest(root).spatial_shape
    except FedsegError:
        return {}
    out = {}
    for path in sorted(sample_dir(root, site, "test").glob("*.npz")):
        try:
            with np.load(path) as z:
                spacing = z["spacing"].tolist() if "spacing" in z.files else [1.0] * len(shape)
        except (OSError, ValueError):
            continue
        out[path.stem] = math.sqrt(sum((n * s) ** 2 for n, s in zip(shape, spacing, strict=False)))
    return out


def distance_unit(run: Run) -> str:
    """``mm`` where the run's federation carries spacing, ``px`` where it does not (``px or
    mm`` when its folder is not readable here)."""
    root = _root(run)
    if root is None:
        return "px or mm"
    for site in run.results["sites"]:
        folder = sample_dir(root, site, "test")
        first = next(iter(sorted(folder.glob("*.npz"))), None) if folder.is_dir() else None
        if first is not None:
            try:
                with np.load(first) as z:
                    return "mm" if "spacing" in z.files else "px"
            except (OSError, ValueError):
                break
    return "px or mm"


def missed_regions(runs: Sequence[Run]) -> set[tuple[str, str, str]]:
    """``(metric, site, region)`` of every distance set to the image diagonal in at least
    one test case of one of ``runs`` (``site`` also ``"Average"``); a run whose
    ``cases.csv`` or federation is not readable here adds nothing."""
    return set().union(*(_missed(run) for run in runs))


def _missed(run: Run) -> set[tuple[str, str, str]]:
    root, cases = _root(run), run.dir / "cases.csv"
    if root is None or not cases.is_file():
        return set()
    try:
        rows = read_cases(cases)
    except FedsegError:
        return set()
    found = set()
    for site, cid, region, metric, value in rows:
        diag = _test_diagonals(root.resolve(), site).get(cid)
        if metric in DISTANCES and diag is not None and math.isclose(value, diag, rel_tol=1e-6):
            found |= {(metric, site, region), (metric, "Average", region)}
    return found


def run_context(runs: Sequence[Run]) -> str:
    """One line for runs of one config (a report row, or one run): schedule, labels and
    annotation types, precision, seeds and distance unit (those of the first run; the
    seeds of all)."""
    run = runs[0]
    seeds = [r.config.get("seed", r.results.get("seed")) for r in runs]
    return "; ".join(
        [
            _schedule(run.config),
            _labels(run),
            _precision(run.results),
            seeds_phrase(seeds),
            f"distances in {distance_unit(run)}",
        ]
    )


def marked(cell: str, metric: str, site: str, region: str, missed: set[tuple]) -> str:
    """``cell`` with :data:`MISSED_MARK` where ``(metric, site, region)`` is in ``missed``."""
    return cell + MISSED_MARK if (metric, site, region) in missed else cell
