"""One federation folder per site: what a hospital keeps on its own disk.

A site's folder is an ordinary federation folder whose manifest lists only that site
(``<out>/<site>/manifest.json`` and ``<out>/<site>/sites/<site>/...``), so the same loader,
checks and weak-label bookkeeping apply. :func:`split_federation` makes such folders from a
full federation (for demos, tests and for shipping synthetic or imported data to sites).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fedseg.data import FederatedDataset, require_valid
from fedseg.data.manifest import write_manifest
from fedseg.errors import DataError

__all__ = ["check_site_folder", "split_federation"]


def split_federation(root: Path, out: Path, sites: list[str] | None = None) -> dict[str, Path]:
    """Copy every (or every listed) site of ``root`` into its own folder under ``out``."""
    fed = FederatedDataset.open(root)
    m = fed.manifest
    folders = {}
    for name in sites or m.site_names:
        info = m.site(name)
        dest = Path(out) / name
        if dest.exists():
            raise DataError(f"{dest} exists; remove it or choose another output folder")
        shutil.copytree(Path(root) / "sites" / name, dest / "sites" / name)
        weak = m.weak_labels
        if weak is not None:
            kept = {k: v for k, v in weak.annotations.items() if k == name}
            weak = weak.model_copy(update={"annotations": kept})
        series = {k: v for k, v in m.series.items() if k == name}  # no other site's series
        write_manifest(
            dest, m.model_copy(update={"sites": [info], "weak_labels": weak, "series": series})
        )
        folders[name] = dest
    return folders


def check_site_folder(data_dir: Path, site: str) -> None:
    """DataError unless ``data_dir`` is a valid federation folder that holds ``site``."""
    fed = FederatedDataset.open(data_dir)
    fed.manifest.site(site)
    require_valid(data_dir)
