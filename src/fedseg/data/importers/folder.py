"""Import a folder per site of 2D image + mask files (PNG/JPG/BMP/TIFF).

Layout: ``SRC/<site>/images/<id>.png`` with ``SRC/<site>/masks/<id>.png`` (or pre-split:
``SRC/<site>/{train,test}/{images,masks}/``); folder names, a mask file prefix and suffix can
differ per site (public polyp sets each name theirs differently). Mask grey levels map to
classes through a user-given mapping (e.g. fundus ``0=0,128=2,255=1``); weak labels can come
from a folder per site beside the masks (the FedICRA PNG release's ``scr/``, ``keypoint/``...).
Everything is resized to one size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from xml.etree import ElementTree

import cv2
import numpy as np
from skimage import draw

from fedseg.data.arrays import resize_image, resize_mask
from fedseg.data.importers.common import (
    assign_splits,
    find_pairs,
    map_levels,
    site_annotations,
    site_dirs,
    stem,
)
from fedseg.data.manifest import IGNORE_INDEX, Annotation, BoxConversion, Manifest
from fedseg.data.writer import FederationWriter
from fedseg.errors import DataError

__all__ = [
    "IMAGE_EXTENSIONS",
    "LAYOUT_KEYS",
    "LIST_SPLITS",
    "MASK_EXTENSIONS",
    "WEAK_DIR_ANNOTATIONS",
    "import_folder",
    "list_pairs",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
MASK_EXTENSIONS = (*IMAGE_EXTENSIONS, ".xml")
"""Masks are images, or ImageScope XML polygons (MoNuSeg), filled with 255 on the image grid."""

LAYOUT_KEYS = ("images_dir", "masks_dir", "mask_prefix", "mask_suffix")
"""What ``site_layout`` may set per site."""

WEAK_DIR_ANNOTATIONS: dict[str, Annotation] = {
    "scr": "scribble",
    "scr_n": "scribble2",
    "keypoint": "point",
    "block": "block",
    "box": "box",
}
"""Annotation type of the FedICRA release's weak-label folders (Lin et al., FedICRA/FedLPPA)."""


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
    mask_prefix: str = "",
    mask_suffix: str = "",
    site_layout: Mapping[str, Mapping[str, str]] | None = None,
    weak_dirs: Mapping[str, str] | None = None,
    weak_mapping: Mapping[int, int] | None = None,
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
    nearest neighbour. Masks are ``<masks_dir>/<mask_prefix><id><mask_suffix>.*``;
    ``site_layout[site]`` overrides any of ``LAYOUT_KEYS`` for one site. Sites without
    ``train/``/``test/`` sub-folders get ``test_fraction`` of their images as test;
    ``val_fraction`` of the training images become val (seeded). A site with list files
    (``train.txt``, ``val.txt``/``test.txt``: ``image mask`` per line, relative to ``src``, the
    layout of the FedBCS/RethinkFL nuclei data) takes its pairs and splits from them.

    ``weak_dirs[site]`` names the folder beside the masks holding that site's weak labels
    (``<id>.*``, for its train and val images), mapped with ``weak_mapping`` (grey level ->
    class, or 255 for unlabeled); the site's annotation type is ``annotations[site]``, or the
    one of a FedICRA folder name (``WEAK_DIR_ANNOTATIONS``).
    """
    if channels not in (1, 3):
        raise DataError(f"--channels must be 1 or 3, got {channels}")
    bad = sorted(c for c in mapping.values() if not 0 <= c < len(class_names))
    if bad:
        raise DataError(f"--mapping classes must be in 0..{len(class_names) - 1}, got {bad}")
    src = Path(src)
    sites = site_dirs(src)
    names = [site.name for site in sites]
    layouts = _layouts(
        dict(zip(LAYOUT_KEYS, (images_dir, masks_dir, mask_prefix, mask_suffix), strict=True)),
        site_layout or {},
        names,
    )
    weak_dirs = dict(weak_dirs or {})
    _check_known(weak_dirs, names, "--weak-dir", src)
    plan = {}
    for site in sites:
        listed = list_pairs(site, src)
        if listed:
            if site.name in weak_dirs:
                raise DataError(f"{site}: --weak-dir is not supported with list files")
            pairs = {k: (img, m, site) for k, (img, m, _) in listed.items()}
            given = {k: split for k, (_, _, split) in listed.items()}
            splits = assign_splits(
                list(pairs), test_fraction=0, val_fraction=val_fraction, seed=seed, given=given
            )
            plan[site.name] = [(k, *pairs[k], splits[k]) for k in pairs]
            continue
        parts = {s: site / s for s in ("train", "test") if (site / s).is_dir()}
        layout = layouts[site.name]
        found = {
            split: (
                folder,
                find_pairs(
                    folder,
                    images_dir=layout["images_dir"],
                    masks_dir=layout["masks_dir"],
                    mask_prefix=layout["mask_prefix"],
                    mask_suffix=layout["mask_suffix"],
                    extensions=IMAGE_EXTENSIONS,
                    mask_extensions=MASK_EXTENSIONS,
                ),
            )
            for split, folder in (parts or {"": site}).items()
        }
        pairs = {
            f"{split}/{k}" if split else k: (img, m, folder)
            for split, (folder, ps) in found.items()
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
        plan[site.name] = [(k, *pairs[k], splits[k]) for k in pairs]
    chosen = site_annotations(annotations, names, src)
    weak_levels = _weak_setup(weak_dirs, weak_mapping, chosen, len(class_names))
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
            for key, img_path, mask_path, folder, split in items:
                image = read_image(img_path, channels)
                raw_mask = _read_mask(mask_path, image.shape[1:])
                _same_size(img_path, image.shape[1:], mask_path, raw_mask.shape)
                mask = map_levels(raw_mask, dict(mapping), tolerance, str(mask_path))
                weak = None
                if site in weak_dirs and split != "test":
                    weak_path = _weak_file(folder / weak_dirs[site], stem(img_path))
                    raw_weak = _read_mask(weak_path, image.shape[1:])
                    _same_size(img_path, image.shape[1:], weak_path, raw_weak.shape)
                    weak = resize_mask(map_levels(raw_weak, weak_levels, 0, str(weak_path)), size)
                writer.add(
                    site,
                    split,
                    key.split("/")[-1],
                    resize_image(image, size),
                    resize_mask(mask, size),
                    weak=weak,
                    origin=str(img_path),
                )
                done += 1
                if progress is not None:
                    progress(done, total)
        return writer.finish(chosen, weak_origin="imported:folder" if weak_dirs else None)


def _check_known(given: Mapping[str, object], names: list[str], what: str, src: Path) -> None:
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise DataError(f"{what} names unknown sites {unknown}; {src} has {names}")


def _layouts(
    default: dict[str, str], per_site: Mapping[str, Mapping[str, str]], names: list[str]
) -> dict[str, dict[str, str]]:
    """Every site's folder names and mask prefix/suffix: the defaults, overridden per site."""
    for site, values in per_site.items():
        if site not in names:
            raise DataError(f"per-site layout names unknown site {site!r}; sites are {names}")
        wrong = sorted(set(values) - set(LAYOUT_KEYS))
        if wrong:
            raise DataError(f"per-site layout of {site!r} sets {wrong}; known: {LAYOUT_KEYS}")
    return {n: {**default, **per_site.get(n, {})} for n in names}


def _weak_setup(
    weak_dirs: dict[str, str],
    weak_mapping: Mapping[int, int] | None,
    chosen: dict[str, Annotation],
    k: int,
) -> dict[int, int]:
    """Check the weak-label folders against the annotations (filling in the type a FedICRA
    folder name implies) and return the weak grey-level mapping."""
    if not weak_dirs:
        return {}
    if not weak_mapping:
        raise DataError("--weak-dir needs --weak-mapping (grey level -> class, 255 = unlabeled)")
    bad = sorted(c for c in weak_mapping.values() if not (0 <= c < k or c == IGNORE_INDEX))
    if bad:
        raise DataError(
            f"--weak-mapping classes must be in 0..{k - 1} or {IGNORE_INDEX}, got {bad}"
        )
    for site, folder in weak_dirs.items():
        if chosen[site] == "full":
            implied = WEAK_DIR_ANNOTATIONS.get(Path(folder).name)
            if implied is None:
                raise DataError(
                    f"--weak-dir {site}={folder} needs --annotation {site}=TYPE (only the "
                    f"folders {sorted(WEAK_DIR_ANNOTATIONS)} imply one)"
                )
            chosen[site] = implied
    missing = sorted(s for s, a in chosen.items() if a != "full" and s not in weak_dirs)
    if missing:
        raise DataError(
            f"sites {missing} are weakly annotated but have no --weak-dir; give one each, or "
            "import without --weak-dir and synthesize weak labels with `fedseg data weak-labels`"
        )
    return dict(weak_mapping)


def _weak_file(folder: Path, image_id: str) -> Path:
    found = [
        folder / f"{image_id}{e}" for e in IMAGE_EXTENSIONS if (folder / f"{image_id}{e}").is_file()
    ]
    if len(found) != 1:
        raise DataError(
            f"{folder}: expected one weak label {image_id}.png (or another image extension), "
            f"found {len(found)}"
        )
    return found[0]


def _same_size(
    img_path: Path, shape: tuple[int, ...], other: Path, other_shape: tuple[int, ...]
) -> None:
    if tuple(shape) != tuple(other_shape):
        raise DataError(
            f"{img_path} is {shape[1]}x{shape[0]} px but its mask {other} is "
            f"{other_shape[1]}x{other_shape[0]} px; an image and its mask must have the same size"
        )


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


def _read_mask(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """Grey levels of a mask image, or an ImageScope XML drawn on an image of ``shape``."""
    if path.suffix.lower() == ".xml":
        return _xml_mask(path, shape)
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if raw is None:
        raise DataError(f"{path}: cannot be read as an image")
    if raw.ndim == 3:
        planes = raw[..., :3]
        if not (planes == planes[..., :1]).all():
            raise DataError(f"{path}: colour mask; expected grey levels (equal R, G and B)")
        raw = planes[..., 0]
    return raw


def _xml_mask(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """The regions of an Aperio ImageScope XML (``Region/Vertices/Vertex`` with pixel ``X``,
    ``Y``: the MoNuSeg annotations) filled with 255 on a ``shape`` grid."""
    try:
        regions = ElementTree.parse(path).getroot().iter("Region")
        polygons = [
            np.array([[float(v.get("Y", "")), float(v.get("X", ""))] for v in r.iter("Vertex")])
            for r in regions
        ]
    except (ElementTree.ParseError, ValueError) as e:
        raise DataError(
            f"{path}: not an ImageScope annotation XML with numeric X, Y ({e})"
        ) from None
    mask = np.zeros(shape, np.uint8)
    for polygon in polygons:
        if len(polygon) >= 3:
            rows, cols = draw.polygon(polygon[:, 0], polygon[:, 1], shape)
            mask[rows, cols] = 255
    return mask
