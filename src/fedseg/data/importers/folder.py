"""Import a folder per site of 2D image + mask files (PNG/JPG/BMP/TIFF).

Layout: ``SRC/<site>/images/<id>.png`` with ``SRC/<site>/masks/<id>.png`` (or pre-split:
``SRC/<site>/{train,test}/{images,masks}/``). Mask grey levels map to classes through a
user-given mapping (e.g. fundus ``0=0,128=2,255=1``); everything is resized to one size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import cv2
import numpy as np

from fedseg.data.arrays import resize_image, resize_mask
from fedseg.data.importers.common import (
    assign_splits,
    find_pairs,
    map_levels,
    site_annotations,
    site_dirs,
    stem,
)
from fedseg.data.manifest import Annotation, BoxConversion, Manifest
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

__all__ = ["IMAGE_EXTENSIONS", "LIST_SPLITS", "import_folder", "list_pairs"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


LIST_SPLITS = {"train.txt": "train", "test.txt": "test", "val.txt": "test"}
"""List files of a site (RethinkFL/FedBCS nuclei layout) and the split they become: ``val.txt``
is the evaluation list of that layout, so it becomes ``test`` unless a ``test.txt`` exists."""


def list_pairs(site: Path, root: Path) -> dict[str, tuple[Path, Path, str]]:
    """``id -> (image, mask, split)`` from ``site/{train,val,test}.txt`` (one ``image mask``
    pair per line, paths relative to ``root``); empty when the site has no list files.

    Raises:
        DataError: naming the list file and line of a malformed line or a missing file.
    """
    lists = {name: site / name for name in LIST_SPLITS if (site / name).is_file()}
    if "test.txt" in lists:
        lists.pop("val.txt", None)
    out: dict[str, tuple[Path, Path, str]] = {}
    for name, path in lists.items():
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 2:
                raise DataError(f"{path}:{n}: expected 'image mask', got {line.strip()!r}")
            img, mask = (root / f for f in fields)
            for f in (img, mask):
                if not f.is_file():
                    raise DataError(f"{path}:{n}: {f} does not exist")
            key = f"{LIST_SPLITS[name]}/{stem(img)}"
            if key in out:
                raise DataError(f"{path}:{n}: image {img.name} is listed twice")
            out[key] = (img, mask, LIST_SPLITS[name])
    return out


def import_folder(
    src: str | Path,
    out: str | Path,
    *,
    class_names: Sequence[str],
    mapping: Mapping[int, int],
    size: tuple[int, int],
    channels: int = 3,
    images_dir: str = "images",
    masks_dir: str = "masks",
    tolerance: int = 0,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    task: str = "imported",
    modality: str = "unspecified",
    annotations: Mapping[str, Annotation] | None = None,
    box_conversion: BoxConversion = "block",
    regions: dict[str, list[int]] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Convert per-site image/mask folders in ``src`` into a federation folder ``out``.

    Images are scaled to [0, 1] by their dtype's maximum, converted to ``channels`` (1 grey or
    3 RGB) and resized to ``size`` (H, W) (area/bilinear); masks are mapped with ``mapping``
    (grey level -> class, values within ``tolerance`` of a level accepted) and resized by
    nearest neighbour. Sites without ``train/``/``test/`` sub-folders get ``test_fraction`` of
    their images as test; ``val_fraction`` of the training images become val (seeded). A site
    with list files (``train.txt``, ``val.txt``/``test.txt``: ``image mask`` per line, relative
    to ``src``, the layout of the FedBCS/RethinkFL nuclei data) takes its pairs and splits from
    them.
    """
    if channels not in (1, 3):
        raise DataError(f"--channels must be 1 or 3, got {channels}")
    bad = sorted(c for c in mapping.values() if not 0 <= c < len(class_names))
    if bad:
        raise DataError(f"--mapping classes must be in 0..{len(class_names) - 1}, got {bad}")
    src = Path(src)
    plan = {}
    for site in site_dirs(src):
        listed = list_pairs(site, src)
        if listed:
            pairs = {k: (img, m) for k, (img, m, _) in listed.items()}
            given = {k: split for k, (_, _, split) in listed.items()}
            splits = assign_splits(
                list(pairs), test_fraction=0, val_fraction=val_fraction, seed=seed, given=given
            )
            plan[site.name] = [(k, img, m, splits[k]) for k, (img, m) in pairs.items()]
            continue
        parts = {s: site / s for s in ("train", "test") if (site / s).is_dir()}
        found = {
            split: find_pairs(
                folder, images_dir=images_dir, masks_dir=masks_dir, extensions=IMAGE_EXTENSIONS
            )
            for split, folder in (parts or {"": site}).items()
        }
        pairs = {
            f"{split}/{k}" if split else k: (img, m)
            for split, ps in found.items()
            for k, img, m in ps
        }
        given = {k: k.split("/")[0] for k in pairs} if parts else None
        splits = assign_splits(
            list(pairs),
            test_fraction=test_fraction,
            val_fraction=val_fraction,
            seed=seed,
            given=given,
        )
        plan[site.name] = [(k, img, m, splits[k]) for k, (img, m) in pairs.items()]
    chosen = site_annotations(annotations, list(plan), src)
    with FederationWriter(
        Path(out),
        task=task,
        class_names=class_names,
        modality=modality,
        channels=channels,
        spatial_shape=size,
        box_conversion=box_conversion,
        regions=regions,
        source=f"imported from image/mask folders in {src}",
        overwrite=overwrite,
    ) as writer:
        total, done = sum(len(v) for v in plan.values()), 0
        for site, items in plan.items():
            for key, img_path, mask_path, split in items:
                image = read_image(img_path, channels)
                raw_mask = _read_mask(mask_path)
                if image.shape[1:] != raw_mask.shape:
                    raise DataError(
                        f"{img_path} is {image.shape[2]}x{image.shape[1]} px but its mask "
                        f"{mask_path} is {raw_mask.shape[1]}x{raw_mask.shape[0]} px; an image "
                        "and its mask must have the same size"
                    )
                mask = map_levels(raw_mask, dict(mapping), tolerance, str(mask_path))
                writer.add(
                    site,
                    split,
                    key.split("/")[-1],
                    resize_image(image, size),
                    resize_mask(mask, size),
                    origin=str(img_path),
                )
                done += 1
                if progress is not None:
                    progress(done, total)
        return writer.finish(chosen)


def read_image(path: Path, channels: int) -> np.ndarray:
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if raw is None:
        raise DataError(f"{path}: cannot be read as an image")
    scale = float(np.iinfo(raw.dtype).max) if np.issubdtype(raw.dtype, np.integer) else 1.0
    image = raw.astype(np.float32) / scale
    if image.ndim == 3:
        image = cv2.cvtColor(image[..., :3], cv2.COLOR_BGR2RGB)  # drop alpha
        if channels == 1:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if image.ndim == 2:
        image = image[..., None].repeat(channels, axis=-1)
    return np.moveaxis(image, -1, 0)


def _read_mask(path: Path) -> np.ndarray:
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if raw is None:
        raise DataError(f"{path}: cannot be read as an image")
    if raw.ndim == 3:
        planes = raw[..., :3]
        if not (planes == planes[..., :1]).all():
            raise DataError(f"{path}: colour mask; expected grey levels (equal R, G and B)")
        raw = planes[..., 0]
    return raw
