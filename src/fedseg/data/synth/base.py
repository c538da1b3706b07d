"""Synthetic task contract, its registry, and ``synthesize`` which writes a federation."""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import torch

from fedseg.data.manifest import Annotation, BoxConversion, Manifest
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError
from fedseg.registry import Registry

__all__ = [
    "SYNTH_TASKS",
    "Sample",
    "SynthTask",
    "letter_names",
    "planned_sites",
    "site_sizes",
    "site_style",
    "split_sizes",
    "synthesize",
]

StyleT = TypeVar("StyleT")
MAX_SITES = 10_000
"""Largest synthetic federation (site names run A..Z, AA..ZZ, AAA, ...)."""
Sample = tuple[np.ndarray, np.ndarray]
"""One sample: image (C, *spatial) float32 and mask (*spatial) uint8."""


@dataclass(frozen=True, kw_only=True)
class SynthTask(Generic[StyleT]):
    """A procedural multi-site task; each task module registers one with ``SYNTH_TASKS``.

    Site ``i`` looks like ``site_style(styles, i)`` and ``sample(style, size, rng)`` draws one
    image and mask of that site.
    """

    class_names: tuple[str, ...]
    modality: str
    channels: int
    styles: tuple[StyleT, ...]
    sample: Callable[[StyleT, int, np.random.Generator], Sample]
    annotations: tuple[Annotation, ...]
    """Default annotation per site (the default number of sites); cycled for more sites."""
    size_weights: tuple[float, ...]
    """Relative site sizes (imbalance), cycled like ``annotations``."""
    source: str
    """Honest description written into the manifest."""
    regions: dict[str, list[int]] = field(default_factory=dict)
    box_conversion: BoxConversion = "block"
    spatial_shape: Callable[[int], tuple[int, ...]] = lambda size: (size, size)
    """Spatial shape of the samples for a ``--size``; 3D tasks return (D, H, W)."""
    spacing: Callable[[StyleT, int], tuple[float, ...]] | None = None
    """Physical element spacing (same axis order) of a site's samples at a ``--size``;
    ``None`` writes no spacing (distances in pixels)."""
    paper_sites: tuple[str, ...] = ()
    """Names of the sites the task simulates (e.g. the public datasets), in site order;
    ``synthesize(..., names="paper")`` uses them instead of letters."""

    def generate(
        self, site: int, n: int, size: int, rng: np.random.Generator, shift: float = 1.0
    ) -> Sample:
        """``n`` samples of site ``site`` (its style at ``shift``, :func:`site_style`) stacked:
        images [n, C, *spatial], masks [n, *spatial]."""
        style = site_style(self.styles, site, shift)
        pairs = [self.sample(style, size, rng) for _ in range(n)]
        return (
            np.stack([p[0] for p in pairs]).astype(np.float32),
            np.stack([p[1] for p in pairs]).astype(np.uint8),
        )


SYNTH_TASKS: Registry[SynthTask[Any]] = Registry("synthetic task")


def site_style(styles: Sequence[StyleT], site: int, shift: float = 1.0) -> StyleT:
    """The appearance of site ``site``: ``styles[site]``, or for sites beyond the list a copy of
    ``styles[site % len]`` with every number scaled by a factor in [0.8, 1.25] drawn from the
    site index (so extra sites differ from each other, deterministically).

    ``shift`` scales every site's distance from the mean style (each number's mean over
    ``styles``): 1 keeps the styles as designed, 0 makes every site the mean site, values in
    between move each number linearly towards its mean (``data.synth.style_shift``)."""
    if shift < 0:
        raise DataError(f"style shift must be >= 0, got {shift}")
    style = _listed_or_jittered(styles, site)
    return style if shift == 1 else _towards_mean(style, styles, shift)


def _towards_mean(style: StyleT, styles: Sequence[StyleT], shift: float) -> StyleT:
    """``style`` with every number ``mean + shift * (value - mean)`` (integers rounded)."""

    def mix(v: object, values: list[object]) -> object:
        if isinstance(v, bool) or not isinstance(v, (int, float, tuple)):
            return v
        if isinstance(v, tuple):
            return tuple(mix(x, [t[i] for t in values]) for i, x in enumerate(v))  # type: ignore[index]
        mean = float(np.mean(values))
        mixed = mean + shift * (v - mean)
        return round(mixed) if isinstance(v, int) else mixed

    changed = {
        f.name: mix(getattr(style, f.name), [getattr(s, f.name) for s in styles])
        for f in fields(style)  # type: ignore[arg-type]
    }
    return replace(style, **changed)  # type: ignore[type-var]


def _listed_or_jittered(styles: Sequence[StyleT], site: int) -> StyleT:
    """``styles[site]``, or the deterministic jittered copy for a site beyond the list."""
    base = styles[site % len(styles)]
    if site < len(styles):
        return base
    rng = np.random.default_rng(site)

    def jitter(v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, (int, float, tuple)):
            return v
        if isinstance(v, tuple):
            return tuple(jitter(x) for x in v)
        scaled = v * float(np.exp(rng.uniform(np.log(0.8), np.log(1.25))))
        return round(scaled) if isinstance(v, int) else scaled

    return replace(base, **{f.name: jitter(getattr(base, f.name)) for f in fields(base)})


@contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch single-threaded (restored afterwards): the per-image tensors of the scanner
    artefacts are tiny, and thread hand-offs made them several times slower on busy CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def site_sizes(weights: Sequence[float], per_site: int, minimum: int = 5) -> list[int]:
    """Imbalanced site sizes with mean about ``per_site``, each at least ``minimum``."""
    w = np.asarray(weights, np.float64)
    return [max(minimum, round(per_site * x)) for x in w / w.mean()]


def letter_names(n: int) -> list[str]:
    """``A``..``Z``, then ``AA``, ``AB``, ... (bijective base 26) for ``n`` sites."""
    names = []
    for i in range(1, n + 1):
        name = ""
        while i:
            i, r = divmod(i - 1, 26)
            name = string.ascii_uppercase[r] + name
        names.append(name)
    return names


def split_sizes(n: int, fractions: Sequence[float]) -> dict[str, int]:
    """Split ``n`` samples into train/val/test by ``fractions``; test takes the remainder."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise DataError(
            f"split fractions must be 3 non-negative numbers summing to 1, got {list(fractions)}"
        )
    n_train = round(n * fractions[0])
    n_val = min(round(n * fractions[1]), n - n_train)
    return {"train": n_train, "val": n_val, "test": n - n_train - n_val}


def planned_sites(
    task: str,
    *,
    sites: int | None = None,
    site_weights: Sequence[float] | None = None,
    names: Literal["letters", "paper"] = "letters",
) -> list[str]:
    """The site names ``synthesize`` writes for these settings (DataError when invalid)."""
    spec = SYNTH_TASKS.get(task)
    if site_weights is not None:
        if not site_weights or min(site_weights) <= 0:
            raise DataError(f"--site-weights must be positive numbers, got {list(site_weights)}")
        if sites is not None and sites != len(site_weights):
            raise DataError(
                f"--sites {sites} disagrees with the {len(site_weights)} --site-weights"
            )
    default_n = len(spec.annotations) if site_weights is None else len(site_weights)
    n_sites = default_n if sites is None else sites
    if not 1 <= n_sites <= MAX_SITES:
        raise DataError(f"--sites must be in 1..{MAX_SITES}, got {n_sites}")
    if names == "letters":
        return letter_names(n_sites)
    if names != "paper":
        raise DataError(f"--names must be 'letters' or 'paper', got {names!r}")
    if n_sites > len(spec.paper_sites):
        raise DataError(
            f"--names paper: task {task!r} names {len(spec.paper_sites)} sites "
            f"{list(spec.paper_sites)}, {n_sites} were asked for"
        )
    return list(spec.paper_sites[:n_sites])


def synthesize(
    task: str,
    out: str | Path,
    *,
    sites: int | None = None,
    size: int = 64,
    per_site: int | None = None,
    seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    site_weights: Sequence[float] | None = None,
    names: Literal["letters", "paper"] = "letters",
    style_shift: float = 1.0,
) -> Manifest:
    """Write a synthetic federation of the registered ``task`` into ``out``.

    Args:
        task: registered task name (``fedseg data synth --help`` lists them).
        out: output folder (must be empty unless ``overwrite``).
        sites: number of sites (default: the task's, i.e. the paper's, site count).
        size: image side in pixels.
        per_site: mean number of images per site (default 40); sizes are imbalanced.
        seed: everything is a deterministic function of the seed (recorded in the manifest).
        split: train/val/test fractions.
        overwrite: replace an existing federation in ``out``.
        progress: called as ``progress(done_sites, total_sites)``.
        site_weights: relative site sizes (e.g. a paper's image counts), replacing the task's
            default imbalance; its length is the number of sites unless ``sites`` is given.
        names: ``letters`` (A, B, ..., Z, AA, ...) or ``paper`` (the simulated datasets'
            names, e.g. RUNMC, BMC, ... for ``prostate``).
        style_shift: how far the sites' appearance lies from the mean site (:func:`site_style`;
            1: the task's styles, 0: identical sites); recorded in the manifest.

    Returns:
        The written manifest (sites with their default annotation, no weak labels yet).
    """
    spec = SYNTH_TASKS.get(task)
    site_names = planned_sites(task, sites=sites, site_weights=site_weights, names=names)
    n_sites = len(site_names)
    if per_site is not None and per_site < 1:
        raise DataError(f"--per-site must be at least 1, got {per_site}")
    if size < 16:
        raise DataError(f"--size must be at least 16 pixels, got {size}")
    if style_shift < 0:
        raise DataError(f"--style-shift must be >= 0, got {style_shift}")
    weights = site_weights or [
        spec.size_weights[i % len(spec.size_weights)] for i in range(n_sites)
    ]
    counts = site_sizes(weights, 40 if per_site is None else per_site)
    plans = [split_sizes(n, split) for n in counts]
    with FederationWriter(
        Path(out),
        task=task,
        class_names=spec.class_names,
        modality=spec.modality,
        channels=spec.channels,
        spatial_shape=spec.spatial_shape(size),
        box_conversion=spec.box_conversion,
        regions=spec.regions,
        source=spec.source,
        style_shift=style_shift,
        synth_seed=seed,
        overwrite=overwrite,
    ) as writer:
        for i, (name, n, plan) in enumerate(zip(site_names, counts, plans, strict=True)):
            with _single_thread():
                images, masks = spec.generate(
                    i, n, size, np.random.default_rng([seed, i]), style_shift
                )
            style = site_style(spec.styles, i, style_shift)
            sp = spec.spacing(style, size) if spec.spacing else None
            k = 0
            for part, count in plan.items():
                for _ in range(count):
                    writer.add(name, part, f"{name}{k:04d}", images[k], masks[k], spacing=sp)
                    k += 1
            if progress is not None:
                progress(i + 1, n_sites)
        annotations = {
            name: spec.annotations[i % len(spec.annotations)] for i, name in enumerate(site_names)
        }
        return writer.finish(annotations)
