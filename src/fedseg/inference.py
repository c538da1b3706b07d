"""Trained models out of a run directory, and predictions on new images.

:class:`RunModels` rebuilds, from ``config.yaml`` and ``checkpoints/last.pt``, the model each
site was evaluated with: the engine's own pieces do it (the method from
:func:`~fedseg.engine.server.make_method`, the payloads through
:class:`~fedseg.engine.server.ServerCore`, the private states through the in-memory link's
:class:`~fedseg.engine.worker.SiteWorker`, which seeds ``Method.eval_model`` as the final
evaluation did). :func:`predict_files` applies a :class:`SiteModel` to PNG/JPG images and
NIfTI volumes with the preprocessing of the importers (``fedseg data import-folder`` /
``import-nifti``) and writes label maps (PNG, or NIfTI with the input's header).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedseg.config import load_config
from fedseg.data import FederatedDataset
from fedseg.data.arrays import normalize_intensity, resize_image, resize_mask
from fedseg.data.importers.common import apply_window, check_window
from fedseg.data.importers.folder import IMAGE_EXTENSIONS
from fedseg.data.importers.folder import read_image as read_image_file
from fedseg.data.importers.nifti import NIFTI_EXTENSIONS
from fedseg.data.importers.nifti import load_volume as load_ras_volume
from fedseg.data.manifest import Manifest
from fedseg.data.resample import resample_image, resample_mask
from fedseg.engine.link import InMemoryLink
from fedseg.engine.rundir import RunDir
from fedseg.engine.runner import site_state_settings
from fedseg.engine.server import ServerCore, make_method, spec_from_json
from fedseg.engine.sites import SiteData, load_sites
from fedseg.engine.worker import initial_model
from fedseg.errors import ConfigError, DataError, FedsegError
from fedseg.evaluation import Segmenter, predict
from fedseg.methods import FederationSpec, Method
from fedseg.methods.training import Precision, precision

__all__ = [
    "GLOBAL",
    "ModelInfo",
    "RunModels",
    "SiteModel",
    "input_files",
    "label_map_module",
    "labels_of",
    "predict_files",
    "window_labels",
]

log = logging.getLogger(__name__)

GLOBAL = "global"
"""Name of the global model (a payload shared by every site that is a complete network)."""

NORMALISATION = {
    "image": "pixel value / maximum of the file's integer dtype -> [0, 1] (import-folder)",
    "volume": "per volume: minimum -> 0, 99.5th percentile -> 1, clipped (import-nifti)",
}
"""How :func:`predict_files` scales new inputs: as the importers scaled the training data."""


@dataclass(frozen=True)
class ModelInfo:
    """What a user of a model needs besides its weights (saved with every export)."""

    method: str
    site: str
    class_names: list[str]
    channels: int
    ndim: int
    spatial_shape: tuple[int, ...]
    """Training size (H, W) / (D, H, W): images are resized to it, volumes windowed by it."""
    ignore_index: int
    regions: dict[str, list[int]]
    modality: str
    normalisation: dict[str, str] = field(default_factory=lambda: dict(NORMALISATION))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spatial_shape": list(self.spatial_shape)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelInfo:
        return cls(**{**raw, "spatial_shape": tuple(raw["spatial_shape"])})


def labels_of(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Segmenter of a module that already returns label maps (ONNX exports)."""
    return model(images)


@dataclass
class SiteModel:
    """A model that maps images ``[N, C, *spatial_shape]`` to label maps ``[N, *S]``."""

    model: nn.Module
    segment: Segmenter
    info: ModelInfo
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: Precision = field(default_factory=Precision)
    """The resolved ``engine.amp``/``engine.channels_last`` of the run on this device: the
    forwards run as the run's evaluation ran them."""

    def label_maps(self, images: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
        """Label maps (int64, on the CPU) of ``images``, in batches of ``batch_size``."""
        with precision(self.precision.amp, bool(self.precision.channels_last)):
            return predict(self.model, images, batch_size, self.device, self.segment)


class _LabelMap(nn.Module):
    def __init__(self, model: nn.Module, segment: Segmenter) -> None:
        super().__init__()
        self.model, self._segment = model, segment

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._segment(self.model, images)


def label_map_module(site_model: SiteModel) -> nn.Module:
    """The model and its method's ``segment`` hook as one module: images -> label maps."""
    return _LabelMap(site_model.model, site_model.segment).eval()


class RunModels:
    """The models of a finished (or checkpointed) run in ``run_dir``.

    ``data_root`` replaces the config's ``data.root`` (needed for site models: a method's
    ``eval_model`` may fine-tune or adapt on the site's data, as in the run's evaluation).
    ``built``: site models the run's final evaluation already built (the in-process
    engine's, :attr:`~fedseg.engine.runner.InProcessRunner.eval_models`), used as they are.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        device: torch.device | str = "cpu",
        data_root: str | Path | None = None,
        built: Mapping[str, nn.Module] | None = None,
    ) -> None:
        rd = RunDir(Path(run_dir))
        if not rd.config.is_file():
            raise ConfigError(f"{rd.path}: no fedseg run directory (no config.yaml)")
        cfg = load_config(rd.config, run_dump=True)
        if data_root is not None:
            data = cfg.data.model_copy(update={"root": Path(data_root)})
            cfg = cfg.model_copy(update={"data": data})
        self.dir, self.cfg, self.device = rd, cfg, torch.device(device)
        ck = rd.load_checkpoint()
        self.round: int = ck["round"] + 1
        """The evaluation round: models after the last checkpointed round."""
        self.spec: FederationSpec = spec_from_json(ck["spec"])
        self.method: Method = make_method(cfg, self.spec)
        self.server = ServerCore(self.method, cfg.train, cfg.seed)
        self.server.load_state_dict(ck["server"])
        self._site_states: dict[str, Any] = dict(ck["sites"])
        self._run_uid: str = ck["run_uid"]
        self._built = dict(built or {})

    @property
    def site_names(self) -> list[str]:
        """The real sites (each has an evaluation model)."""
        return self.spec.site_names

    @cached_property
    def federation(self) -> FederatedDataset:
        root = self.cfg.data.root
        if not (root / "manifest.json").is_file():
            raise DataError(
                f"{root}: the run's data (data.root) is not there; site models are built on "
                "the site's data as in the run's evaluation: pass the federation folder "
                "(--data), or predict with an exported model (fedseg export)"
            )
        return FederatedDataset.open(root)

    @property
    def manifest(self) -> Manifest:
        return self.federation.manifest

    @cached_property
    def sites(self) -> dict[str, SiteData]:
        """Every real site's data, loaded as the runner loads it."""
        cfg = self.cfg
        _, sites = load_sites(self.federation, cfg.data.labels, cfg.data.sites, cfg.eval.split)
        return sites

    @cached_property
    def link(self) -> InMemoryLink:
        """The in-memory sites with their checkpointed private states (read from the run's
        ``sites/`` folder where the run kept them on disk, ``engine.site_states: disk``)."""
        link = InMemoryLink(
            self.spec,
            self.sites,
            self.manifest.regions,
            train=self.cfg.train,
            seed=self.cfg.seed,
            device=self.device,
            eval_batch_size=self.cfg.eval.batch_size,
            precision=Precision(self.cfg.engine.amp, self.cfg.engine.channels_last),
            **site_state_settings(self.cfg, self.dir.path),
        )
        link.bind(self.method, self._run_uid)
        missing = sorted(set(link.workers) - set(self._site_states))
        if missing:
            raise FedsegError(
                f"{self.dir.path}: the checkpoint holds no private state of {missing}: on "
                "Flower every site keeps its state in its own state folder, so this run's "
                "site models can only be rebuilt at the sites"
            )
        link.load_state_dict(self._site_states)
        return link

    def info(self, site: str) -> ModelInfo:
        m = self.manifest
        return ModelInfo(
            method=self.cfg.method_name,
            site=site,
            class_names=list(m.class_names),
            channels=m.channels,
            ndim=m.ndim,
            spatial_shape=tuple(m.spatial_shape),
            ignore_index=m.ignore_index,
            regions={k: list(v) for k, v in m.regions.items()},
            modality=m.modality,
        )

    def site_model(self, site: str) -> SiteModel:
        """The model ``site`` was evaluated with (a copy: the workspace network is shared)."""
        if site == GLOBAL:
            glob = self.global_model()
            if glob is None:
                raise ConfigError(f"method {self.cfg.method_name!r} has no global model")
            return glob
        if site not in self.site_names:
            raise ConfigError(f"--site {site!r} is no site of this run; sites: {self.site_names}")
        link = self.link
        key = site if site in link.workers else next(iter(link.workers))  # pooled training
        worker = link.workers[key]
        model = self._built.get(site)
        if model is None:
            model = worker.eval_model(self.round, self.server.payloads[key], self.sites[site])
        return SiteModel(
            copy.deepcopy(model).to(self.device).eval(),
            self.method.segment,
            self.info(site),
            self.device,
            worker.precision,
        )

    def global_model(self) -> SiteModel | None:
        """The server's model when every site gets one payload that is a complete network
        (FedAvg and the like), or the pooled site's model of centralized training; None for
        methods without one (personal parts, prototypes...)."""
        if self.method.pooled:
            pooled = self.site_model(self.site_names[0])
            return replace(pooled, info=replace(pooled.info, site=GLOBAL))
        payloads = {id(p): p for p in self.server.payloads.values()}
        if len(payloads) != 1:
            return None
        model = initial_model(self.method, self.cfg.seed, self.device)
        try:
            model.load_state_dict(next(iter(payloads.values())).tensors, strict=True)
        except (RuntimeError, KeyError):
            return None
        used = next(iter(self.link.workers.values())).precision
        return SiteModel(model.eval(), self.method.segment, self.info(GLOBAL), self.device, used)

    def model_names(self) -> list[str]:
        """Every site, plus ``global`` when the method has a global model."""
        return self.site_names + ([GLOBAL] if self.global_model() is not None else [])


def window_labels(
    site_model: SiteModel, image: torch.Tensor, overlap: float = 0.5, batch_size: int = 4
) -> torch.Tensor:
    """Label map ``[*S]`` of one image ``[C, *S]`` of any size by sliding windows of the
    training size (MONAI's ``sliding_window_inference``; an image smaller than a window is
    padded). Overlapping windows vote: each window's label map (the method's ``segment``
    hook) is one-hot encoded and the Gaussian-weighted votes are arg-maxed."""
    from monai.inferers import sliding_window_inference

    k = len(site_model.info.class_names)
    dims = tuple(range(1, site_model.info.ndim + 1))

    def votes(x: torch.Tensor) -> torch.Tensor:
        lab = site_model.segment(site_model.model, x)
        return nn.functional.one_hot(lab, k).permute(0, -1, *dims).float()

    site_model.model.eval()
    with torch.no_grad():
        out = sliding_window_inference(
            image[None].to(site_model.device),
            roi_size=site_model.info.spatial_shape,
            sw_batch_size=batch_size,
            predictor=votes,
            overlap=overlap,
            mode="gaussian",
        )
    assert isinstance(out, torch.Tensor)
    return out[0].argmax(0).cpu()


Fit = Literal["window", "resize"]
Format = Literal["auto", "dicom-seg"]
FORMATS: tuple[str, ...] = ("auto", "dicom-seg")
"""Output formats: ``auto`` (PNG for images, NIfTI for volumes) or ``dicom-seg``."""


def _is_nifti(path: Path) -> bool:
    return any(path.name.lower().endswith(e) for e in NIFTI_EXTENSIONS)


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def input_files(folder: Path) -> list[Path]:
    """The images and volumes of ``folder`` (sorted); DataError when there are none."""
    if not folder.is_dir():
        raise DataError(f"--input {folder}: no such folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and (_is_image(p) or _is_nifti(p)))
    if not files:
        raise DataError(
            f"--input {folder}: no images ({', '.join(IMAGE_EXTENSIONS)}) or NIfTI volumes "
            "(.nii, .nii.gz)"
        )
    return files


@dataclass(frozen=True)
class _Volumes:
    """How volumes are prepared and predicted (``predict_files``' options)."""

    fit: Fit
    overlap: float
    axis: int
    batch_size: int
    ct_window: tuple[float, float] | None
    spacing: tuple[float, ...] | None

    @property
    def order(self) -> list[int]:
        """RAS axes with ``axis`` first."""
        return [self.axis] + [a for a in range(3) if a != self.axis]


def predict_files(
    site_model: SiteModel,
    folder: str | Path,
    out: str | Path,
    *,
    fit: Fit = "window",
    overlap: float = 0.5,
    axis: int = 2,
    batch_size: int = 4,
    output_format: Format = "auto",
    ct_window: tuple[float, float] | None = None,
    spacing: Sequence[float] | None = None,
) -> list[Path]:
    """Write a label map for every image and volume in ``folder`` into ``out``.

    2D models: images are read and scaled as by ``import-folder`` and resized to the training
    size; NIfTI volumes are cut into slices along ``axis`` (after RAS reorientation), each
    resized. 3D models take NIfTI volumes, scaled as by ``import-nifti`` with ``axis`` first,
    predicted by sliding windows of the training size (``fit="window"``) or resized to it
    (``fit="resize"``, for runs imported with resizing). Label maps go back to the input's
    size and orientation: ``<name>.png`` (uint8 labels) or ``<name>.nii.gz`` with the
    input's affine and header.

    Give the import's settings: ``ct_window`` (LOW, HIGH in HU) scales volumes as
    ``--ct-window`` did; ``spacing`` (mm; 2D models H,W, 3D D,H,W with ``axis`` first)
    resamples volumes as ``--spacing`` did (linear) and the labels back to the input's grid
    (nearest); 2D slices are then predicted by sliding windows of the training size, as
    imports with ``--spacing`` cropped them, not resized.

    ``output_format="dicom-seg"`` reads the DICOM image series in ``folder`` instead (any file
    names), prepared as by ``import-dicom``, and writes one DICOM-SEG per series (named by the
    first 12 digits of the SHA-256 of its UID, as the imported sample ids), referencing the
    series, one segment per foreground class.
    """
    if fit not in ("window", "resize"):
        raise ConfigError(f"--fit must be window or resize, got {fit!r}")
    if axis not in (0, 1, 2):
        raise ConfigError(f"--axis must be 0, 1 or 2, got {axis}")
    check_window(ct_window, "--ct-window")
    if output_format not in FORMATS:
        raise ConfigError(f"--format must be one of {FORMATS}, got {output_format!r}")
    ndim = site_model.info.ndim
    if spacing is not None and (
        len(spacing) != ndim or not all(0 < v < float("inf") for v in spacing)
    ):
        raise ConfigError(
            f"--spacing needs {ndim} positive values in mm for a {ndim}D model, got "
            f"{tuple(spacing)}"
        )
    how = _Volumes(
        fit, overlap, axis, batch_size, ct_window, None if spacing is None else tuple(spacing)
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if output_format == "dicom-seg":
        return _predict_dicom(site_model, Path(folder), out, how)
    written = []
    for path in input_files(Path(folder)):
        if _is_nifti(path):
            written.append(_predict_volume(site_model, path, out, how))
        else:
            written.append(_predict_image(site_model, path, out, batch_size))
        log.info("%s -> %s", path.name, written[-1])
    return written


def _check_channels(info: ModelInfo, path: Path, have: int) -> None:
    if have != info.channels:
        raise DataError(
            f"{path}: has {have} channel(s), the model of {info.site!r} expects {info.channels}"
        )


def _predict_image(sm: SiteModel, path: Path, out: Path, batch_size: int) -> Path:
    import cv2

    info = sm.info
    if info.ndim != 2:
        raise DataError(
            f"{path}: a 2D image; the model of {info.site!r} is 3D and needs NIfTI volumes "
            f"(.nii, .nii.gz) with {info.channels} channel(s)"
        )
    if info.channels not in (1, 3):
        raise DataError(f"{path}: images give 1 or 3 channels, the model expects {info.channels}")
    image = read_image_file(path, info.channels)
    x = torch.from_numpy(resize_image(image, info.spatial_shape))[None]
    labels = sm.label_maps(x, batch_size)[0].numpy()
    target = out / f"{path.stem}.png"
    cv2.imwrite(str(target), resize_mask(labels, image.shape[1:]))
    return target


def _volume_labels(
    sm: SiteModel, volume: np.ndarray, zooms: Sequence[float], how: _Volumes
) -> np.ndarray:
    """uint8 label map of a scaled volume ``(D, H, W)`` (depth axis first) with voxel size
    ``zooms``: slice by slice (2D models, each slice resized), by sliding windows or resized
    (3D models, ``how.fit``). With ``how.spacing`` the volume is resampled to it first, 2D
    slices are windowed instead of resized, and the labels are resampled back to ``zooms``
    (the grid's first corner stays put, so the far edges are cropped or padded to fit)."""
    info, shape = sm.info, volume.shape
    windowed = how.fit == "window" if info.ndim == 3 else how.spacing is not None
    target = tuple(zooms)
    if how.spacing is not None:
        target = (zooms[0], *how.spacing) if info.ndim == 2 else how.spacing
        volume = resample_image(volume, zooms, target)
    if windowed and info.ndim == 2:
        labels = np.stack(
            [
                window_labels(sm, torch.from_numpy(s[None]), how.overlap, how.batch_size).numpy()
                for s in volume
            ]
        )
    elif windowed:
        labels = window_labels(sm, torch.from_numpy(volume[None]), how.overlap, how.batch_size)
        labels = labels.numpy()
    elif info.ndim == 2:
        slices = np.stack([resize_image(s[None], info.spatial_shape) for s in volume])
        labels = sm.label_maps(torch.from_numpy(slices), how.batch_size).numpy()
        labels = np.stack([resize_mask(lab, volume.shape[1:]) for lab in labels])
    else:
        x = torch.from_numpy(resize_image(volume[None], info.spatial_shape))[None]
        labels = resize_mask(sm.label_maps(x, how.batch_size)[0].numpy(), volume.shape)
    labels = labels.astype(np.uint8)
    if how.spacing is None:
        return labels
    back = resample_mask(labels, target, zooms)[tuple(slice(n) for n in shape)]
    return np.pad(back, [(0, n - m) for n, m in zip(shape, back.shape, strict=True)])


def _predict_dicom(sm: SiteModel, folder: Path, out: Path, how: _Volumes) -> list[Path]:
    """A DICOM-SEG ``<series hash>.dcm`` for every image series in ``folder``, the volume
    prepared as ``import-dicom`` prepares it and the labels put back on the series' grid."""
    from fedseg import __version__
    from fedseg.data.importers.dicom import dicom_volume, read_series
    from fedseg.data.importers.dicom_seg import write_seg
    from fedseg.data.importers.dicom_series import from_ras, series_hash

    if not folder.is_dir():
        raise DataError(f"--input {folder}: no such folder")
    found = read_series(folder)
    if not found:
        raise DataError(f"--input {folder}: no DICOM image series (--format dicom-seg)")
    written = []
    for series in found:
        _check_channels(sm.info, series.paths[0], 1)
        volume, zooms, ornt = dicom_volume(series, how.axis, how.ct_window)
        labels = _volume_labels(sm, volume, zooms, how)
        grid = from_ras(np.transpose(labels, np.argsort(how.order)), ornt)
        target = out / f"{series_hash(series.uid)[:12]}.dcm"
        name = f"fedseg {sm.info.method} ({sm.info.site})"
        written.append(
            write_seg(
                grid, series, sm.info.class_names, target, algorithm=name, version=__version__
            )
        )
        log.info("%s -> %s", series.name, target)
    return written


def _predict_volume(sm: SiteModel, path: Path, out: Path, how: _Volumes) -> Path:
    import nibabel as nib

    canon, data = load_ras_volume(path, "image")  # a damaged file is named as such first
    _check_channels(sm.info, path, 1)
    volume = np.transpose(data, how.order)
    window = how.ct_window
    volume = normalize_intensity(volume) if window is None else apply_window(volume, window)
    zooms = nib.affines.voxel_sizes(canon.affine)[how.order]
    ras = np.transpose(_volume_labels(sm, volume, zooms, how), np.argsort(how.order))
    original = nib.load(path)
    ornt = nib.orientations.ornt_transform(
        nib.orientations.io_orientation(canon.affine),
        nib.orientations.io_orientation(original.affine),
    )
    mask = nib.orientations.apply_orientation(ras, ornt).astype(np.uint8)
    header = original.header.copy()
    header.set_data_dtype(np.uint8)
    image = nib.Nifti1Image(mask, original.affine, header)
    image.header.set_slope_inter(1, 0)
    target = out / (_stem(path) + ".nii.gz")
    nib.save(image, target)
    return target


def _stem(path: Path) -> str:
    name = path.name
    for ext in sorted(NIFTI_EXTENSIONS, key=len, reverse=True):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return path.stem
