"""Writing a federation folder: samples, weak labels and the manifest (used by synth/importers)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedseg.data.federation import sample_dir, weak_path
from fedseg.data.manifest import (
    IGNORE_INDEX,
    MANIFEST,
    SPLITS,
    Annotation,
    BoxConversion,
    Manifest,
    SiteInfo,
    WeakLabelRecord,
    sparsity_of,
    validate_manifest,
    write_manifest,
)
from fedseg.errors import DataError

__all__ = ["FederationWriter", "prepare_output"]


def prepare_output(root: Path, overwrite: bool) -> None:
    """Make ``root`` an empty folder; with ``overwrite`` clear an existing federation in it.

    Raises:
        DataError: ``root`` is not empty and ``overwrite`` is false, or it is not a federation
            (no manifest.json), which is never cleared.
    """
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise DataError(f"{root} is not empty; choose a new folder or pass --overwrite")
        if not (root / MANIFEST).is_file():
            raise DataError(f"refusing to clear {root}: it holds no {MANIFEST} (not a federation)")
        shutil.rmtree(root / "sites", ignore_errors=True)
        (root / MANIFEST).unlink()
    root.mkdir(parents=True, exist_ok=True)


class FederationWriter:
    """Writes samples as ``sites/<site>/<split>/<id>.npz`` and finally the manifest.

    Every sample is checked against the task (channels, shape, class values) as it is added,
    and the error names ``origin`` (the source file) when given.
    """

    def __init__(
        self,
        root: Path,
        *,
        task: str,
        class_names: Sequence[str],
        modality: str,
        channels: int,
        spatial_shape: Sequence[int],
        box_conversion: BoxConversion = "block",
        regions: dict[str, list[int]] | None = None,
        source: str = "",
        overwrite: bool = False,
    ) -> None:
        prepare_output(root, overwrite)
        self.root = Path(root)
        self.meta = {
            "task": task,
            "class_names": list(class_names),
            "modality": modality,
            "channels": channels,
            "ndim": len(spatial_shape),
            "spatial_shape": tuple(int(s) for s in spatial_shape),
            "box_conversion": box_conversion,
            "regions": regions or {},
            "source": source,
        }
        self.num_classes = len(class_names)
        self.counts: dict[str, dict[str, int]] = {}
        validate_manifest({**self.meta, "sites": [{"name": "probe"}]}, "federation settings")

    def add(
        self,
        site: str,
        split: str,
        sample_id: str,
        image: np.ndarray,
        mask: np.ndarray,
        *,
        spacing: Sequence[float] | None = None,
        weak: np.ndarray | None = None,
        origin: str = "",
    ) -> None:
        """Validate and write one sample (and optionally its weak label)."""
        where = origin or f"{site}/{split}/{sample_id}"
        shape = self.meta["spatial_shape"]
        if split not in SPLITS:
            raise DataError(f"{where}: split must be one of {list(SPLITS)}, got {split!r}")
        if image.shape != (self.meta["channels"], *shape):
            raise DataError(
                f"{where}: image shape must be {(self.meta['channels'], *shape)}, got {image.shape}"
            )
        if mask.shape != shape:
            raise DataError(f"{where}: mask shape must be {shape}, got {mask.shape}")
        if not np.isfinite(image).all():
            raise DataError(f"{where}: image holds non-finite values")
        _check_values(where, "mask", mask, set(range(self.num_classes)))
        arrays = {"image": image.astype(np.float32), "mask": mask.astype(np.uint8)}
        if spacing is not None:
            if len(spacing) != len(shape):
                raise DataError(f"{where}: spacing needs {len(shape)} values, got {spacing}")
            arrays["spacing"] = np.asarray(spacing, np.float64)
        folder = sample_dir(self.root, site, split)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"{sample_id}.npz", **arrays)
        if weak is not None:
            self.add_weak(site, split, sample_id, weak, origin=where)
        per_site = self.counts.setdefault(site, dict.fromkeys(SPLITS, 0))
        per_site[split] += 1

    def add_weak(
        self, site: str, split: str, sample_id: str, weak: np.ndarray, *, origin: str = ""
    ) -> None:
        """Write one weak label (class indices, ``IGNORE_INDEX`` = unlabeled)."""
        where = origin or f"{site}/{split}/{sample_id}"
        if weak.shape != self.meta["spatial_shape"]:
            raise DataError(
                f"{where}: weak label shape must be {self.meta['spatial_shape']}, got {weak.shape}"
            )
        _check_values(where, "weak label", weak, {*range(self.num_classes), IGNORE_INDEX})
        path = weak_path(self.root, site, split, sample_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, weak.astype(np.uint8))

    def finish(
        self, annotations: dict[str, Annotation], *, weak_origin: str | None = None
    ) -> Manifest:
        """Write ``manifest.json`` for the sites in ``annotations`` (in that order).

        ``weak_origin`` records that weak labels were written (e.g. ``imported:h5``).
        """
        unknown = sorted(set(self.counts) - set(annotations))
        if unknown:
            raise DataError(f"samples were written for undeclared sites {unknown}")
        sites = [
            SiteInfo(
                name=name,
                annotation=ann,
                sparsity=sparsity_of(ann, self.meta["box_conversion"]),
                splits=self.counts.get(name, dict.fromkeys(SPLITS, 0)),
            )
            for name, ann in annotations.items()
        ]
        weak = None
        if weak_origin is not None:
            weak = WeakLabelRecord(origin=weak_origin, annotations=dict(annotations))
        raw = {**self.meta, "sites": sites, "weak_labels": weak}
        manifest = validate_manifest(raw, str(self.root / MANIFEST))
        write_manifest(self.root, manifest)
        return manifest


def _check_values(where: str, what: str, array: np.ndarray, allowed: set[int]) -> None:
    bad = sorted(set(np.unique(array).tolist()) - allowed)
    if bad:
        raise DataError(f"{where}: {what} values must be in {sorted(allowed)}, got {bad[:10]}")
