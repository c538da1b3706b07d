"""Make sure a run's federation folder exists and is valid before training starts."""

from __future__ import annotations

import logging
from pathlib import Path

from fedseg.config import RunConfig
from fedseg.data import require_valid
from fedseg.errors import ConfigError

__all__ = ["prepare_data"]

log = logging.getLogger(__name__)


def prepare_data(cfg: RunConfig) -> Path:
    """Return ``data.root``, synthesizing it first when missing and ``data.synth`` is set.

    Raises ConfigError when the folder is missing and nothing can create it, and DataError
    (listing every problem) when ``fedseg data check`` would fail.
    """
    root = cfg.data.root
    if not (root / "manifest.json").exists():
        syn = cfg.data.synth
        if syn is None:
            raise ConfigError(
                f"data.root {root} holds no manifest.json; create it with `fedseg data synth` "
                "or an importer, or set data.synth in the config"
            )
        from fedseg.data.synth import synthesize
        from fedseg.data.weak import generate_weak_labels

        log.info("synthesizing %s federation into %s", syn.task, root)
        synthesize(
            syn.task,
            root,
            sites=syn.sites,
            size=syn.size,
            per_site=syn.per_site,
            seed=syn.seed,
            site_weights=syn.site_weights,
            names=syn.names,
            style_shift=syn.style_shift,
            split=syn.split,
        )
        if syn.weak_labels:
            generate_weak_labels(root, seed=syn.seed)
    elif cfg.data.synth is not None:
        _check_matches_synth(cfg)
    require_valid(root, cfg.train.batch_size, labels=cfg.data.labels, sites=cfg.data.sites)
    return root


def _check_matches_synth(cfg: RunConfig) -> None:
    """Refuse an existing ``data.root`` that is not the federation ``data.synth`` describes
    (e.g. a config whose site weights changed while the old folder stayed)."""
    from fedseg.data.manifest import read_manifest
    from fedseg.data.synth import SYNTH_TASKS, planned_sites

    syn, root = cfg.data.synth, cfg.data.root
    assert syn is not None
    m = read_manifest(root)
    wanted = planned_sites(
        syn.task, sites=syn.sites, site_weights=syn.site_weights, names=syn.names
    )
    shape = SYNTH_TASKS.get(syn.task).spatial_shape(syn.size)
    shift = 1.0 if m.style_shift is None else m.style_shift
    if m.task != syn.task or m.site_names != wanted or tuple(m.spatial_shape) != shape:
        raise ConfigError(
            f"data.root {root} holds task {m.task!r} with sites {m.site_names} of shape "
            f"{tuple(m.spatial_shape)}, but data.synth describes {syn.task!r} with sites "
            f"{wanted} of shape {shape}; "
            "remove the folder to re-synthesize it or point data.root elsewhere"
        )
    if shift != syn.style_shift:
        raise ConfigError(
            f"data.root {root} was synthesized with style_shift {shift:g}, but "
            f"data.synth.style_shift is {syn.style_shift:g}; point data.root elsewhere"
        )
    if m.synth_seed is None:
        raise ConfigError(
            f"data.root {root} was synthesized before fedseg recorded the synthesis seed: its "
            "images were drawn with the seed of whichever run built the folder, so runs of "
            "other seeds may have used other images; remove the folder to re-synthesize it "
            f"with data.synth.seed {syn.seed}"
        )
    if m.synth_seed != syn.seed:
        raise ConfigError(
            f"data.root {root} was synthesized with seed {m.synth_seed}, but data.synth.seed "
            f"is {syn.seed}; point data.root elsewhere or remove the folder"
        )
    weak = m.weak_labels
    if (
        syn.weak_labels
        and weak is not None
        and weak.origin == "synthesized"
        and weak.seed != syn.seed
    ):
        raise ConfigError(
            f"data.root {root} holds weak labels drawn with seed {weak.seed}, but "
            f"data.synth.seed is {syn.seed}; remove the folder to re-synthesize it"
        )
