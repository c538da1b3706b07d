"""Validation of a federation folder: ``check_federation`` lists problems, ``require_valid``
refuses to start a run on a broken folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedseg.data.federation import (
    WEAK_HINT,
    FederatedDataset,
    label_problems,
    read_npy,
    read_npz,
    sample_dir,
    sample_ids,
    sample_problems,
    weak_path,
)
from fedseg.data.manifest import MANIFEST, SPLITS, Manifest, SiteInfo
from fedseg.errors import DataError

__all__ = ["Problem", "check_federation", "require_valid"]


@dataclass(frozen=True)
class Problem:
    """One problem found in a federation folder."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def check_federation(
    fed: FederatedDataset,
    batch_size: int | None = None,
    labels: Literal["full", "weak"] = "full",
    sites: Sequence[str] | None = None,
) -> list[Problem]:
    """Every problem of ``fed``: missing, extra, damaged or unreadable files, samples breaking
    the on-disk contract (dtypes, shapes, value ranges, label values, spacing; docs/data.md),
    spacing on only some samples, empty sites, train splits smaller than ``batch_size`` and,
    when ``labels`` is ``weak`` (what ``fedseg data check`` checks unless told ``--labels
    full``), weak labels that the manifest's annotations call for but were never generated,
    are missing or are stale. Sizes are checked only for ``sites`` (default: every site),
    the sites a run uses."""
    problems = _check_site_folders(fed)
    spacing: dict[str, dict[str, bool]] = {}
    for site in fed.manifest.sites:
        if sites is None or site.name in sites:
            problems += _check_site_sizes(fed.root, site, batch_size)
        if labels == "weak":
            problems += _check_weak_record(fed, site)
        spacing[site.name] = {}
        for split in SPLITS:
            problems += _check_split(fed.root, fed.manifest, site, split, spacing[site.name])
    return problems + _check_spacing_everywhere(fed.root, spacing)


def require_valid(
    root: str | Path,
    batch_size: int | None = None,
    labels: Literal["full", "weak"] = "full",
    sites: Sequence[str] | None = None,
) -> FederatedDataset:
    """Open ``root`` and raise DataError listing all problems unless it is valid (the sizes
    of ``sites`` only, when given: :func:`check_federation`)."""
    fed = FederatedDataset.open(root)
    problems = check_federation(fed, batch_size=batch_size, labels=labels, sites=sites)
    if problems:
        listing = "\n  ".join(str(p) for p in problems)
        raise DataError(
            f"{fed.root} has {len(problems)} problem(s); fix them or re-create the folder:\n"
            f"  {listing}"
        )
    return fed


def _check_site_folders(fed: FederatedDataset) -> list[Problem]:
    folder = fed.root / "sites"
    found = {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()
    return [
        Problem(
            folder / name,
            f"site folder not listed in {MANIFEST} (its sites: {fed.site_names}); add the "
            "site to the manifest or remove the folder",
        )
        for name in sorted(found - set(fed.site_names))
    ]


def _check_spacing_everywhere(root: Path, spacing: dict[str, dict[str, bool]]) -> list[Problem]:
    """Spacing makes HD95/ASSD physical: every sample of the federation carries it, or none
    (else averages mix mm and pixels). The samples of the minority are named, per site."""
    flags = [has for per_site in spacing.values() for has in per_site.values()]
    n_with, n_without = sum(flags), len(flags) - sum(flags)
    if not n_with or not n_without:
        return []
    odd = n_with < n_without
    problems = []
    for site, per_sample in spacing.items():
        keys = [key for key, has in per_sample.items() if has == odd]
        if keys:
            what = (
                f"carry 'spacing' but {n_without} samples of the federation do not"
                if odd
                else f"carry no 'spacing' but {n_with} samples of the federation do"
            )
            problems.append(
                Problem(
                    root / "sites" / site,
                    f"{len(keys)} of {len(per_sample)} samples ({_ids(keys)}) {what}; give "
                    "every sample spacing or none",
                )
            )
    return problems


def _check_site_sizes(root: Path, site: SiteInfo, batch_size: int | None) -> list[Problem]:
    where = root / MANIFEST
    if sum(site.splits.values()) == 0:
        return [Problem(where, f"site {site.name!r} has no samples in any split")]
    n_train = site.splits["train"]
    if n_train == 0:
        return [Problem(where, f"site {site.name!r} has an empty train split")]
    if batch_size is not None and n_train < batch_size:
        return [
            Problem(
                where,
                f"site {site.name!r} has {n_train} training samples, fewer than the batch "
                f"size {batch_size}",
            )
        ]
    return []


def _check_weak_record(fed: FederatedDataset, site: SiteInfo) -> list[Problem]:
    if site.annotation == "full":
        return []
    record = fed.manifest.weak_labels
    made_for = record.annotations.get(site.name) if record else None
    where = fed.root / MANIFEST
    if made_for is None:
        return [Problem(where, f"site {site.name!r} has no weak labels; {WEAK_HINT}")]
    if made_for != site.annotation:
        return [
            Problem(
                where,
                f"site {site.name!r} weak labels were made for {made_for!r}, the annotation is "
                f"{site.annotation!r}; {WEAK_HINT}",
            )
        ]
    problems = []
    for split in ("train", "val"):
        missing = [
            i
            for i in sample_ids(fed.root, site.name, split)
            if not weak_path(fed.root, site.name, split, i).is_file()
        ]
        if missing:
            folder = sample_dir(fed.root, site.name, split) / "weak"
            problems.append(
                Problem(folder, f"weak labels missing for {_ids(missing)}; {WEAK_HINT}")
            )
    return problems


def _check_split(
    root: Path, m: Manifest, site: SiteInfo, split: str, spacing: dict[str, bool]
) -> list[Problem]:
    """Problems of one split; records in ``spacing`` whether each readable sample has it."""
    folder = sample_dir(root, site.name, split)
    ids = sample_ids(root, site.name, split)
    expected = site.splits[split]
    problems: list[Problem] = []
    if expected and not folder.is_dir():
        return [Problem(folder, f"folder missing; the manifest lists {expected} samples")]
    if len(ids) != expected:
        problems.append(
            Problem(folder, f"manifest says {expected} samples, found {len(ids)} .npz files")
        )
    for sid in ids:
        path = folder / f"{sid}.npz"
        try:
            arrays = read_npz(path)
        except DataError as e:
            problems.append(_problem(path, e))
            continue
        problems += [Problem(path, p) for p in sample_problems(arrays, m)]
        spacing[f"{split}/{sid}"] = "spacing" in arrays
    weak_dir = folder / "weak"
    if weak_dir.is_dir():
        weak_ids = {p.stem for p in weak_dir.glob("*.npy") if p.is_file()}
        orphans = sorted(weak_ids - set(ids))
        if orphans:
            problems.append(Problem(weak_dir, f"weak labels without a sample: {_ids(orphans)}"))
        for sid in sorted(weak_ids & set(ids)):
            problems += _check_weak_file(weak_path(root, site.name, split, sid), m)
    return problems


def _check_weak_file(path: Path, m: Manifest) -> list[Problem]:
    try:
        weak = read_npy(path)
    except DataError as e:
        return [_problem(path, e)]
    shape = tuple(m.spatial_shape)
    found = label_problems(weak, shape, m.num_classes, "weak label", m.ignore_index)
    return [Problem(path, p) for p in found]


def _problem(path: Path, e: DataError) -> Problem:
    """A reader's DataError as a Problem (its reason starts with the path)."""
    return Problem(path, e.reason.removeprefix(f"{path}: "))


def _ids(ids: list[str], limit: int = 5) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
