"""The federation manifest (``manifest.json``): task, classes, sites and their annotations."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedseg.errors import DataError

__all__ = [
    "ANNOTATIONS",
    "BOX_CONVERSIONS",
    "IGNORE_INDEX",
    "MANIFEST",
    "SPLITS",
    "Annotation",
    "BoxConversion",
    "Manifest",
    "SiteInfo",
    "Sparsity",
    "WeakLabelRecord",
    "check_annotations",
    "read_manifest",
    "sparsity_of",
    "validate_manifest",
    "write_manifest",
]

MANIFEST = "manifest.json"
IGNORE_INDEX = 255
SPLITS = ("train", "val", "test")

Annotation = Literal["full", "point", "scribble", "scribble2", "block", "box", "rotated_box"]
Sparsity = Literal["sparse", "medium", "dense"]
BoxConversion = Literal["scribble", "block"]
ANNOTATIONS: tuple[str, ...] = get_args(Annotation)
BOX_CONVERSIONS: tuple[str, ...] = get_args(BoxConversion)

_SPARSITY: dict[str, Sparsity | None] = {
    "full": None,
    "point": "sparse",
    "scribble": "medium",
    "scribble2": "medium",
    "block": "dense",
}


def check_annotations(
    given: Mapping[str, str], what: str = "--annotation"
) -> dict[str, Annotation]:
    """Validate ``{site: annotation type}`` (DataError naming the bad entries)."""
    bad = {site: ann for site, ann in given.items() if ann not in ANNOTATIONS}
    if bad:
        raise DataError(f"{what}: annotation types must be in {list(ANNOTATIONS)}, got {bad}")
    return cast(dict[str, Annotation], dict(given))


def sparsity_of(annotation: str, box_conversion: str) -> Sparsity | None:
    """The annotation sparsity prompt of ``annotation`` (boxes take that of their conversion)."""
    if annotation in ("box", "rotated_box"):
        return _SPARSITY[box_conversion]
    return _SPARSITY[annotation]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SiteInfo(_Frozen):
    """One site: its name, annotation type, sparsity level and split sizes."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    annotation: Annotation = "full"
    sparsity: Sparsity | None = None
    """Sparsity after box conversion: point=sparse, scribbles=medium, block=dense, full=null."""
    splits: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    """Number of samples per split (``train``, ``val``, ``test``)."""

    @model_validator(mode="before")
    @classmethod
    def _fill_splits(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("splits"), dict):
            unknown = sorted(set(data["splits"]) - set(SPLITS))
            if unknown:
                raise ValueError(f"splits has unknown keys {unknown}; allowed {list(SPLITS)}")
            data = {**data, "splits": {s: data["splits"].get(s, 0) for s in SPLITS}}
        return data

    @model_validator(mode="after")
    def _non_negative(self) -> SiteInfo:
        bad = {k: v for k, v in self.splits.items() if v < 0}
        if bad:
            raise ValueError(f"site {self.name!r}: split sizes must be >= 0, got {bad}")
        return self


class WeakLabelRecord(_Frozen):
    """How the weak labels on disk were made, so stale ones are detected."""

    origin: str
    """``synthesized`` (by ``fedseg data weak-labels``) or ``imported:<format>``."""
    seed: int | None = None
    annotations: dict[str, Annotation]
    """Per-site annotation type the weak-label files were made for."""


class Manifest(_Frozen):
    """The contents of ``manifest.json``; see docs/data.md for every field."""

    format_version: Literal[1] = 1
    task: str = Field(min_length=1)
    class_names: list[str] = Field(min_length=2)
    """Class names; index 0 is the background."""
    modality: str = Field(min_length=1)
    channels: int = Field(ge=1)
    ndim: Literal[2, 3]
    spatial_shape: tuple[int, ...]
    """Spatial shape shared by every sample (H, W) or (D, H, W)."""
    ignore_index: int = IGNORE_INDEX
    regions: dict[str, list[int]] = Field(default_factory=dict)
    """Evaluation regions {name: class indices}; default: each foreground class alone."""
    box_conversion: BoxConversion = "block"
    """What box annotations are converted to before training."""
    source: str = ""
    """Where the data come from (e.g. 'synthetic procedural phantoms')."""
    style_shift: float | None = Field(None, ge=0)
    """Synthetic federations: how far the sites' appearance lies from the mean site
    (``data.synth.style_shift``; 1 the task's styles); ``None`` for imported data and for
    synthetic folders written before the setting existed (made at 1)."""
    synth_seed: int | None = None
    """Synthetic federations: the seed the images and splits were drawn with
    (``data.synth.seed``); ``None`` for imported data and for synthetic folders written
    before it was recorded (drawn with the seed of whichever run built them)."""
    sites: list[SiteInfo] = Field(min_length=1)
    weak_labels: WeakLabelRecord | None = None
    series: dict[str, list[str]] = Field(default_factory=dict)
    """DICOM imports: per site, the SHA-256 (hex) of every imported SeriesInstanceUID (sample
    ids begin with its first 12 digits), so a site finds its source series while the UIDs
    themselves stay there; empty otherwise."""

    @model_validator(mode="before")
    @classmethod
    def _default_regions(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("regions") and data.get("class_names"):
            names = data["class_names"]
            data = {**data, "regions": {n: [i] for i, n in enumerate(names) if i > 0}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        k = self.num_classes
        if len(set(self.class_names)) != k:
            raise ValueError(f"class_names must be unique, got {self.class_names}")
        if not (k <= self.ignore_index <= 255):
            raise ValueError(f"ignore_index must lie in [{k}, 255], got {self.ignore_index}")
        if len(self.spatial_shape) != self.ndim or min(self.spatial_shape) < 1:
            raise ValueError(
                f"spatial_shape must hold {self.ndim} positive sizes, got {self.spatial_shape}"
            )
        for name, idx in self.regions.items():
            if not idx or any(not 0 < i < k for i in idx):
                raise ValueError(f"regions.{name} must list classes in 1..{k - 1}, got {idx}")
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must be unique, got {names}")
        for s in self.sites:
            want = sparsity_of(s.annotation, self.box_conversion)
            if s.sparsity != want:
                raise ValueError(
                    f"site {s.name!r}: sparsity of a {s.annotation!r} annotation with "
                    f"box_conversion {self.box_conversion!r} must be {want}, got {s.sparsity}"
                )
        return self

    @property
    def num_classes(self) -> int:
        """Number of classes including the background."""
        return len(self.class_names)

    @property
    def site_names(self) -> list[str]:
        """Site names in manifest order."""
        return [s.name for s in self.sites]

    def site(self, name: str) -> SiteInfo:
        """The site called ``name``; DataError listing the sites if unknown."""
        for s in self.sites:
            if s.name == name:
                return s
        raise DataError(f"unknown site {name!r}; the manifest has {self.site_names}")


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_manifest(root: Path) -> Manifest:
    """Read and validate ``root/manifest.json``; DataError names the file and each bad field."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DataError(
            f"{path} {what}; create a federation with `fedseg data synth` or an importer"
        )
    try:
        text = path.read_bytes()
        raw = json.loads(text.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        why = "the file is empty" if not text.strip() else str(e)
        raise DataError(f"{path}: not valid JSON ({why})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    return validate_manifest(raw, str(path))


def validate_manifest(raw: object, where: str) -> Manifest:
    """``Manifest.model_validate`` whose errors become one DataError listing every field."""
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "manifest"
            if err["type"] == "value_error":  # our validators already say what they got
                lines.append(f"{field}: {err['msg'].removeprefix('Value error, ')}")
            else:
                got = "" if err["type"] == "missing" else f" (got {_short(err['input'])})"
                lines.append(f"{field}: {err['msg']}{got}")
        sep = " " if len(lines) == 1 else "\n  "  # one problem: one line
        raise DataError(f"{where}: invalid manifest:{sep}" + "\n  ".join(lines)) from None


def write_manifest(root: Path, manifest: Manifest) -> Path:
    """Write ``manifest`` as indented JSON to ``root/manifest.json``."""
    path = Path(root) / MANIFEST
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    return path
