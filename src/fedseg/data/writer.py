"""Writing a federation folder: samples, weak labels and the manifest (used by synth/importers)."""

from __future__ import annotations

import os
import secrets
import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from fedseg.data.federation import label_problems, sample_dir, sample_problems, weak_path
from fedseg.data.manifest import (
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

__all__ = ["FederationWriter", "check_output"]

_CONTENT = ("sites", MANIFEST)
"""What a federation folder consists of (anything else in it, e.g. previews, is kept)."""


def check_output(root: Path, overwrite: bool) -> None:
    """Refuse to write a federation into ``root`` unless it is missing or empty, or it holds a
    federation and ``overwrite`` is set.

    Raises:
        DataError: ``root`` is a file, or not empty without ``overwrite``, or not empty and no
            federation (no manifest.json), which is never replaced.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise DataError(f"{root} is a file; choose a folder for the federation")
    if root.is_dir() and any(root.iterdir()):
        if not overwrite:
            raise DataError(f"{root} is not empty; choose a new folder or pass --overwrite")
        if not (root / MANIFEST).is_file():
            raise DataError(f"refusing to clear {root}: it holds no {MANIFEST} (not a federation)")


class FederationWriter:
    """Writes samples as ``sites/<site>/<split>/<id>.npz`` and finally the manifest.

    Every sample is checked against the on-disk contract (docs/data.md) as it is added, and the
    error names ``origin`` (the source file) when given. Everything is written into a hidden
    folder ``root/.partial-<pid>-<random>`` whose ``sites/`` and manifest :meth:`finish` moves
    into ``root``, so a failed import leaves ``root`` as it was (absent, or holding the old
    federation, which is replaced only then). Use the writer as a context manager to remove the
    hidden folder as soon as writing fails (it is removed at exit anyway, and by the next writer
    into ``root`` if the process was killed).
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
        style_shift: float | None = None,
        synth_seed: int | None = None,
        overwrite: bool = False,
    ) -> None:
        self.root = Path(root)
        self.overwrite = overwrite
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
            "style_shift": style_shift,
            "synth_seed": synth_seed,
        }
        self.counts: dict[str, dict[str, int]] = {}
        self.task = validate_manifest(
            {**self.meta, "sites": [{"name": "probe"}]}, "federation settings"
        )
        """The settings as a one-site manifest, to check samples against."""
        _remove_stale(self.root)
        check_output(self.root, overwrite)
        created = None if self.root.exists() else self.root
        self.staging = self.root / f".partial-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            self.staging.mkdir(parents=True)
        except OSError as e:
            raise DataError(f"cannot write into {self.root}: {e.strerror or e}") from None
        self._discard = weakref.finalize(self, _discard, self.staging, created)

    def __enter__(self) -> FederationWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()

    def discard(self) -> None:
        """Remove everything written so far (``root`` is left as it was)."""
        self._discard()

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
        """Validate and write one sample (and optionally its weak label).

        ``image`` may be any real dtype (it is stored as float32), ``mask`` any dtype holding
        whole numbers (stored as uint8).
        """
        where = origin or f"{site}/{split}/{sample_id}"
        if split not in SPLITS:
            raise DataError(f"{where}: split must be one of {list(SPLITS)}, got {split!r}")
        if image.dtype.kind not in "fiu":
            raise DataError(f"{where}: image must hold real numbers, got dtype {image.dtype}")
        arrays = {
            "image": image.astype(np.float32),
            "mask": _whole(where, "mask", mask),
        }
        if spacing is not None:
            arrays["spacing"] = np.asarray(spacing, np.float64)
        self._require(where, sample_problems(arrays, self.task))
        arrays["mask"] = arrays["mask"].astype(np.uint8)
        path = sample_dir(self.staging, site, split) / f"{sample_id}.npz"
        if path.exists():
            raise DataError(f"{where}: sample id {sample_id!r} occurs twice in {site}/{split}")
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **arrays)
        if weak is not None:
            self.add_weak(site, split, sample_id, weak, origin=where)
        per_site = self.counts.setdefault(site, dict.fromkeys(SPLITS, 0))
        per_site[split] += 1

    def add_weak(
        self, site: str, split: str, sample_id: str, weak: np.ndarray, *, origin: str = ""
    ) -> None:
        """Write one weak label (class indices, ``ignore_index`` 255 = unlabeled)."""
        where = origin or f"{site}/{split}/{sample_id}"
        label = _whole(where, "weak label", weak)
        m = self.task
        self._require(
            where,
            label_problems(label, m.spatial_shape, m.num_classes, "weak label", m.ignore_index),
        )
        path = weak_path(self.staging, site, split, sample_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, label.astype(np.uint8))

    @staticmethod
    def _require(where: str, problems: list[str]) -> None:
        if problems:
            raise DataError(f"{where}: {'; '.join(problems)}")

    def finish(
        self,
        annotations: dict[str, Annotation],
        *,
        weak_origin: str | None = None,
        series: dict[str, list[str]] | None = None,
    ) -> Manifest:
        """Write ``manifest.json`` for the sites in ``annotations`` (in that order).

        ``weak_origin`` records that weak labels were written (e.g. ``imported:h5``);
        ``series`` the hashed DICOM series UIDs per site.
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
        raw = {**self.meta, "sites": sites, "weak_labels": weak, "series": series or {}}
        manifest = validate_manifest(raw, str(self.root / MANIFEST))
        write_manifest(self.staging, manifest)
        self._commit()
        return manifest

    def _commit(self) -> None:
        """Move the written federation into ``root``, replacing the one there if allowed."""
        if not self.overwrite and (self.root / MANIFEST).exists():
            raise DataError(f"{self.root}: another process wrote a federation here meanwhile")
        old = self.root / f".old-{os.getpid()}-{secrets.token_hex(4)}"
        old.mkdir()
        for name in _CONTENT:
            if (self.root / name).exists():
                os.replace(self.root / name, old / name)
        for name in _CONTENT:
            if (self.staging / name).exists():
                os.replace(self.staging / name, self.root / name)
        shutil.rmtree(old)
        self._discard.detach()
        shutil.rmtree(self.staging)


def _discard(staging: Path, created: Path | None) -> None:
    """Remove ``staging`` and the output folder ``created`` for it, if that is empty now."""
    shutil.rmtree(staging, ignore_errors=True)
    if created is not None and created.is_dir() and not any(created.iterdir()):
        created.rmdir()


def _remove_stale(root: Path) -> None:
    """Remove the hidden folders of writes into ``root`` whose process was killed (its pid is
    part of the folder name and gone); those of live processes are left alone."""
    for folder in root.glob(".partial-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _whole(where: str, what: str, label: np.ndarray) -> np.ndarray:
    """``label`` as int64; DataError unless it holds whole numbers."""
    if label.dtype.kind in "biu":
        return label.astype(np.int64)
    if label.dtype.kind == "f" and np.isfinite(label).all() and (label == np.rint(label)).all():
        return label.astype(np.int64)
    raise DataError(f"{where}: {what} must hold whole class numbers, got dtype {label.dtype}")
