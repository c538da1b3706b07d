"""``fedseg data``: create, import, check and preview federation folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from fedseg.console import console, handled
from fedseg.console import progress as _progress
from fedseg.data.manifest import ANNOTATIONS, Manifest
from fedseg.errors import DataError

if TYPE_CHECKING:
    from fedseg.data.importers.nifti import NiftiImport

__all__ = ["app"]

R = TypeVar("R", bound="NiftiImport")

app = typer.Typer(
    help="Create (synth), import, weakly annotate, check and preview federation folders.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

SiteAnnotations = Annotated[
    list[str] | None,
    typer.Option(
        "--annotation",
        help=f"SITE=TYPE, repeatable; TYPE in {', '.join(ANNOTATIONS)}.",
    ),
]
BoxTo = Annotated[
    str | None, typer.Option("--box-to", help="Convert boxes to 'scribble' or 'block'.")
]
Seed = Annotated[int, typer.Option(help="Seed of every random choice.")]
Overwrite = Annotated[bool, typer.Option(help="Replace an existing federation in OUT.")]
ValFraction = Annotated[
    float, typer.Option(help="Share of each site's training data drawn as val.")
]
TestFraction = Annotated[
    float, typer.Option(help="Share drawn as test when a site has no train/ and test/ folders.")
]
Classes = Annotated[
    str, typer.Option(help="Comma-separated class names, background first, e.g. bg,cup,rim.")
]
Task = Annotated[str, typer.Option(help="Task name written into the manifest.")]
Modality = Annotated[str, typer.Option(help="Modality written into the manifest.")]


def _import_volumes(
    what: str,
    importer: Callable[..., R],
    source: Path | list[Path],
    out: Path,
    *,
    mode: str,
    shape: str,
    fit: str | None,
    keep_empty: bool,
    ct_window: str | None,
    spacing: str | None,
    annotation: list[str] | None,
    **options: Any,
) -> R:
    """Run a volume ``importer`` on ``source`` under a progress bar labelled ``what``, with the
    CLI's shape, fit, window, spacing and annotation options parsed; print its summary."""
    with handled():
        n = 2 if mode == "2d" else 3
        parsed = {
            "shape": _sizes(shape, n, "--shape"),
            "ct_window": _window(ct_window),
            "spacing": _spacing(spacing, n),
            "annotations": _assignments(annotation, "--annotation"),
        }
        with _progress(what) as progress:
            result = importer(
                source,
                out,
                mode=mode,
                fit=fit,
                drop_empty=not keep_empty,
                progress=progress,
                **parsed,
                **options,
            )
    _volume_summary(out, result)
    return result


def _volume_summary(out: Path, result: NiftiImport) -> None:
    """The federation table of a volume import and how many empty slices it dropped."""
    _summary(out, result.manifest)
    if result.dropped_slices:
        console.print(
            f"dropped {result.dropped_slices} slices with empty masks (--keep-empty keeps them)"
        )


def _summary(root: Path, m: Manifest) -> None:
    table = Table(title=f"{root}: {m.task} ({m.modality}), classes {', '.join(m.class_names)}")
    for column in ("site", "annotation", "sparsity", "train", "val", "test"):
        table.add_column(column)
    for s in m.sites:
        table.add_row(
            s.name, s.annotation, s.sparsity or "-", *(str(s.splits[k]) for k in s.splits)
        )
    console.print(table)
    if m.source:
        console.print(f"source: {m.source}", highlight=False)


def _assignments(items: list[str] | None, what: str) -> dict[str, str]:
    from fedseg.data.importers.common import parse_assignments

    return parse_assignments(items or [], what)


def _per_site(items: list[str] | None, what: str, default: str) -> tuple[str, dict[str, str]]:
    """``["images", "B=Original"]`` -> ``("images", {"B": "Original"})``: a plain value sets
    every site's, ``SITE=VALUE`` one site's."""
    plain = [i for i in items or [] if "=" not in i]
    if len(plain) > 1:
        raise DataError(f"{what} takes one value for all sites (others as SITE=VALUE), got {plain}")
    return (plain[0] if plain else default), _assignments(
        [i for i in items or [] if "=" in i], what
    )


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise DataError(f"{what} must be comma-separated integers, got {text!r}") from None


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise DataError(f"{what} must be comma-separated numbers, got {text!r}") from None


def _window(text: str | None) -> tuple[float, float] | None:
    """``"-160,240"`` -> ``(-160.0, 240.0)``; the window is checked by the importers."""
    if text is None:
        return None
    values = _floats(text, "--ct-window")
    if len(values) != 2:
        raise DataError(f"--ct-window must be LOW,HIGH, got {text!r}")
    return values[0], values[1]


VoxelSpacing = Annotated[
    str | None,
    typer.Option(help="Resample to this spacing in mm: 2d H,W; 3d D,H,W (one value: all)."),
]
Interpolation = Annotated[
    str, typer.Option(help="Image resampling with --spacing: linear or cubic.")
]
VolumeFit = Annotated[
    str | None,
    typer.Option(help="resize, or crop (centre crop/pad); default resize, crop with --spacing."),
]


def _spacing(text: str | None, n: int) -> list[float] | None:
    """``"1.5"`` -> ``[1.5] * n``; ``"3,1,1"`` -> ``[3.0, 1.0, 1.0]`` (checked by the importer)."""
    if text is None:
        return None
    values = _floats(text, "--spacing")
    return values * n if len(values) == 1 else values


CtWindow = Annotated[
    str | None,
    typer.Option(
        help="LOW,HIGH in HU: clip CT to the window, scale to [0, 1] (--ct-window=-160,240)."
    ),
]
VolumeMode = Annotated[str, typer.Option(help="2d (slices) or 3d (volumes).")]
VolumeShape = Annotated[str, typer.Option(help="2d: S or H,W; 3d: D,H,W.")]
SliceAxis = Annotated[int, typer.Option(help="Slice/depth axis after RAS reorientation.")]
KeepEmpty = Annotated[bool, typer.Option(help="2d: keep slices with empty masks.")]


def _sizes(text: str, n: int, what: str) -> tuple[int, ...]:
    """``"64"`` or ``"64,48"`` -> ``n`` positive sizes (one value is repeated)."""
    values = _ints(text, what)
    values = values * n if len(values) == 1 else values
    if len(values) != n or min(values) < 1:
        raise DataError(f"{what} needs 1 or {n} positive sizes, got {text!r}")
    return tuple(values)


@app.command()
def synth(
    task: Annotated[
        str, typer.Option(help="Registered task, e.g. fundus, polyp, prostate, faz, brain, nuclei.")
    ],
    out: Annotated[Path, typer.Option(help="Output federation folder.")],
    sites: Annotated[int | None, typer.Option(help="Number of sites (default: task's).")] = None,
    size: Annotated[int, typer.Option(help="Image side in pixels.")] = 64,
    per_site: Annotated[int, typer.Option(help="Mean images per site (sizes vary).")] = 40,
    seed: Seed = 0,
    split: Annotated[str, typer.Option(help="train,val,test fractions.")] = "0.7,0.1,0.2",
    weak_labels: Annotated[
        bool, typer.Option(help="Also generate the sites' default weak labels.")
    ] = True,
    overwrite: Overwrite = False,
    site_weights: Annotated[
        str | None,
        typer.Option(help="Relative site sizes, e.g. a paper's counts 97,200,462,50."),
    ] = None,
    names: Annotated[
        str, typer.Option(help="Site names: letters (A, B, ...) or paper (e.g. RUNMC, BMC).")
    ] = "letters",
    style_shift: Annotated[
        float,
        typer.Option(help="Sites' distance from the mean style: 1 as designed, 0 identical."),
    ] = 1.0,
) -> None:
    """Write a synthetic multi-site federation (procedural phantoms or template-derived)."""
    from fedseg.data.synth import synthesize
    from fedseg.data.weak import generate_weak_labels

    with handled():
        try:
            fractions = [float(v) for v in split.split(",")]
        except ValueError:
            raise DataError(f"--split must be three comma-separated numbers, got {split}") from None
        try:
            weights = None if site_weights is None else [float(v) for v in site_weights.split(",")]
        except ValueError:
            raise DataError(
                f"--site-weights must be comma-separated numbers, got {site_weights}"
            ) from None
        with _progress(f"synthesizing {task}") as progress:
            m = synthesize(
                task,
                out,
                sites=sites,
                size=size,
                per_site=per_site,
                seed=seed,
                split=fractions,
                overwrite=overwrite,
                progress=progress,
                site_weights=weights,
                names=names,  # type: ignore[arg-type]  # checked by synthesize
                style_shift=style_shift,
            )
        if weak_labels:
            with _progress("weak labels") as progress:
                m = generate_weak_labels(out, seed=seed, progress=progress)
    _summary(out, m)


@app.command("weak-labels")
def weak_labels_cmd(
    root: Annotated[Path, typer.Argument(help="Federation folder.")],
    seed: Seed = 0,
    annotation: SiteAnnotations = None,
    box_to: BoxTo = None,
) -> None:
    """(Re)generate weak labels from the full masks; images are never rewritten."""
    from fedseg.data.weak import generate_weak_labels

    with handled():
        overrides = _assignments(annotation, "--annotation")
        with _progress("weak labels") as progress:
            m = generate_weak_labels(
                root, seed=seed, annotations=overrides, box_conversion=box_to, progress=progress
            )
    _summary(root, m)


@app.command()
def check(
    root: Annotated[Path, typer.Argument(help="Federation folder.")],
    batch_size: Annotated[
        int | None, typer.Option(help="Flag train splits smaller than this.")
    ] = None,
    labels: Annotated[
        str,
        typer.Option(
            help="'weak': every site whose manifest annotation is not full needs its weak "
            "labels; 'full': skip weak labels (for runs with data.labels: full)."
        ),
    ] = "weak",
) -> None:
    """List every problem of a federation folder, one line each; exit status 1 if any."""
    from fedseg.data.checks import check_federation
    from fedseg.data.federation import FederatedDataset

    with handled():
        if labels not in ("full", "weak"):
            raise DataError(f"--labels must be 'full' or 'weak', got {labels!r}")
        if batch_size is not None and batch_size < 1:
            raise DataError(f"--batch-size must be at least 1, got {batch_size}")
        fed = FederatedDataset.open(root)
        problems = check_federation(fed, batch_size, labels)  # type: ignore[arg-type]
    if not problems:
        console.print(f"[green]ok[/]: {root} ({len(fed.site_names)} sites) has no problems")
        return
    console.print(
        f"[bold red]{len(problems)} problem(s)[/] in {root}:", highlight=False, soft_wrap=True
    )
    for p in problems:  # one unwrapped line each, so paths stay whole and greppable
        console.print(f"  {p}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def preview(
    root: Annotated[Path, typer.Argument(help="Federation folder.")],
    out: Annotated[Path | None, typer.Option(help="Output folder (default ROOT/preview).")] = None,
    n: Annotated[int, typer.Option(help="Samples per site.")] = 4,
    split: Annotated[str, typer.Option(help="train, val or test.")] = "train",
) -> None:
    """Save PNG overlays per site: image | full mask | weak label."""
    from fedseg.data.preview import preview as make_preview

    with handled(), _progress("preview") as progress:
        paths = make_preview(root, out, n=n, split=split, progress=progress)
    for p in paths:
        console.print(f"wrote {p}", highlight=False)


@app.command("import-h5")
def import_h5_cmd(
    src: Annotated[Path, typer.Argument(help="Folder of DomainK/{train,test}/*.h5.")],
    out: Annotated[Path, typer.Argument(help="Output federation folder.")],
    classes: Classes,
    task: Task = "imported",
    modality: Modality = "unspecified",
    annotation: SiteAnnotations = None,
    weak_key: Annotated[
        list[str] | None,
        typer.Option(
            help="SITE=KEY, repeatable; KEY in scribble, scribble_noisy, block, box, "
            "keypoint (default: the key of the site's --annotation)."
        ),
    ] = None,
    box_to: BoxTo = None,
    val_fraction: ValFraction = 0.0,
    seed: Seed = 0,
    overwrite: Overwrite = False,
) -> None:
    """Import the FedLPPA authors' h5 layout (unlabeled = number of classes -> 255)."""
    from fedseg.data.importers import import_h5

    with handled(), _progress("importing h5") as progress:
        m = import_h5(
            src,
            out,
            class_names=classes.split(","),
            task=task,
            modality=modality,
            annotations=_assignments(annotation, "--annotation"),
            weak_keys=_assignments(weak_key, "--weak-key"),
            box_conversion=box_to or "block",
            val_fraction=val_fraction,
            seed=seed,
            overwrite=overwrite,
            progress=progress,
        )
    _summary(out, m)


@app.command("import-folder")
def import_folder_cmd(
    src: Annotated[Path, typer.Argument(help="Folder with one sub-folder per site.")],
    out: Annotated[Path, typer.Argument(help="Output federation folder.")],
    classes: Classes,
    mapping: Annotated[str, typer.Option(help="Mask grey level -> class, e.g. 0=0,128=2,255=1.")],
    size: Annotated[str, typer.Option(help="Output size: S or H,W.")] = "256",
    channels: Annotated[int, typer.Option(help="1 (grey) or 3 (RGB).")] = 3,
    images_dir: Annotated[
        list[str] | None,
        typer.Option(
            help="Image sub-folder of a site (images); SITE=DIR for one site, repeatable."
        ),
    ] = None,
    masks_dir: Annotated[
        list[str] | None,
        typer.Option(help="Mask sub-folder of a site (masks); SITE=DIR for one site, repeatable."),
    ] = None,
    mask_prefix: Annotated[
        list[str] | None,
        typer.Option(help="Masks named <prefix><id> (any case); SITE=PREFIX for one site."),
    ] = None,
    mask_suffix: Annotated[
        list[str] | None,
        typer.Option(help="Masks named <id><suffix> (any case); SITE=SUFFIX for one site."),
    ] = None,
    weak_dir: Annotated[
        list[str] | None,
        typer.Option(help="SITE=DIR: weak labels <id>.png in DIR beside the masks, repeatable."),
    ] = None,
    weak_mapping: Annotated[
        str | None,
        typer.Option(
            help="Weak-label grey level -> class or 255 (unlabeled), e.g. 0=0,127=1,254=255."
        ),
    ] = None,
    tolerance: Annotated[int, typer.Option(help="Accepted grey-level drift (JPEG).")] = 0,
    region: Annotated[
        list[str] | None, typer.Option(help="NAME=c1,c2 evaluation region, repeatable.")
    ] = None,
    test_fraction: TestFraction = 0.2,
    val_fraction: ValFraction = 0.0,
    seed: Seed = 0,
    task: Task = "imported",
    modality: Modality = "unspecified",
    annotation: SiteAnnotations = None,
    box_to: BoxTo = None,
    overwrite: Overwrite = False,
) -> None:
    """Import per-site folders of 2D images and grey-level masks (PNG/JPG/BMP/TIFF)."""
    from fedseg.data.importers import import_folder
    from fedseg.data.importers.common import parse_levels

    with handled():
        regions = {
            k: _ints(v, f"--region {k}") for k, v in _assignments(region, "--region").items()
        }
        h, w = _sizes(size, 2, "--size")
        layout = {
            "images_dir": _per_site(images_dir, "--images-dir", "images"),
            "masks_dir": _per_site(masks_dir, "--masks-dir", "masks"),
            "mask_prefix": _per_site(mask_prefix, "--mask-prefix", ""),
            "mask_suffix": _per_site(mask_suffix, "--mask-suffix", ""),
        }
        site_layout: dict[str, dict[str, str]] = {}
        for key, (_, sites) in layout.items():
            for site, value in sites.items():
                site_layout.setdefault(site, {})[key] = value
        with _progress("importing images") as progress:
            m = import_folder(
                src,
                out,
                class_names=classes.split(","),
                mapping=parse_levels(mapping),
                size=(h, w),
                channels=channels,
                **{key: default for key, (default, _) in layout.items()},
                site_layout=site_layout,
                weak_dirs=_assignments(weak_dir, "--weak-dir"),
                weak_mapping=parse_levels(weak_mapping) if weak_mapping else None,
                tolerance=tolerance,
                test_fraction=test_fraction,
                val_fraction=val_fraction,
                seed=seed,
                task=task,
                modality=modality,
                annotations=_assignments(annotation, "--annotation"),
                box_conversion=box_to or "block",
                regions=regions or None,
                overwrite=overwrite,
                progress=progress,
            )
    _summary(out, m)


@app.command("import-nifti")
def import_nifti_cmd(
    src: Annotated[Path, typer.Argument(help="Folder with one sub-folder per site.")],
    out: Annotated[Path, typer.Argument(help="Output federation folder.")],
    classes: Classes,
    mode: VolumeMode = "2d",
    shape: VolumeShape = "256",
    axis: SliceAxis = 2,
    fit: VolumeFit = None,
    keep_empty: KeepEmpty = False,
    mapping: Annotated[
        str | None, typer.Option(help="Label value -> class, e.g. 0=0,255=1.")
    ] = None,
    images_dir: Annotated[str, typer.Option(help="Image sub-folder of a site.")] = "images",
    masks_dir: Annotated[str, typer.Option(help="Label sub-folder of a site.")] = "labels",
    mask_suffix: Annotated[
        str, typer.Option(help="Labels as <case><suffix>.nii.gz (any case), beside or in labels/.")
    ] = "",
    test_fraction: TestFraction = 0.2,
    val_fraction: ValFraction = 0.0,
    seed: Seed = 0,
    task: Task = "imported",
    modality: Annotated[
        str, typer.Option(help="Modality in the manifest; CT needs --ct-window.")
    ] = "MRI",
    ct_window: CtWindow = None,
    spacing: VoxelSpacing = None,
    interpolation: Interpolation = "linear",
    annotation: SiteAnnotations = None,
    overwrite: Overwrite = False,
) -> None:
    """Import per-site NIfTI volumes as 2D slices or 3D volumes (spacing from the affine)."""
    from fedseg.data.importers import import_nifti
    from fedseg.data.importers.common import parse_levels

    with handled():
        levels = parse_levels(mapping) if mapping else None
    _import_volumes(
        "importing volumes",
        import_nifti,
        src,
        out,
        class_names=classes.split(","),
        mode=mode,
        shape=shape,
        axis=axis,
        fit=fit,
        keep_empty=keep_empty,
        mapping=levels,
        images_dir=images_dir,
        masks_dir=masks_dir,
        mask_suffix=mask_suffix,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        seed=seed,
        task=task,
        modality=modality,
        ct_window=ct_window,
        spacing=spacing,
        interpolation=interpolation,
        annotation=annotation,
        overwrite=overwrite,
    )


@app.command("import-nnunet")
def import_nnunet_cmd(
    sources: Annotated[
        list[Path], typer.Argument(help="nnU-Net v2 or MSD dataset folders (with dataset.json).")
    ],
    out: Annotated[Path, typer.Option(help="Output federation folder.")],
    mode: VolumeMode = "2d",
    shape: VolumeShape = "256",
    axis: SliceAxis = 2,
    fit: VolumeFit = None,
    keep_empty: KeepEmpty = False,
    normalize: Annotated[
        str, typer.Option(help="Per-channel, per-case: minmax ([0, 1]), zscore or none.")
    ] = "minmax",
    ct_window: CtWindow = None,
    spacing: VoxelSpacing = None,
    interpolation: Interpolation = "linear",
    site_csv: Annotated[
        Path | None, typer.Option(help="CSV with columns case,site (default: site per dataset).")
    ] = None,
    site_regex: Annotated[
        str | None, typer.Option(help="Regex on the case id; its 'site' group (or group 1).")
    ] = None,
    test_fraction: Annotated[float, typer.Option(help="Share of each site's cases as test.")] = 0.2,
    val_fraction: ValFraction = 0.0,
    seed: Seed = 0,
    task: Task = "imported",
    annotation: SiteAnnotations = None,
    overwrite: Overwrite = False,
) -> None:
    """Import nnU-Net v2 raw datasets / MSD tasks (one site per dataset, CSV or regex)."""
    from fedseg.data.importers.nnunet import import_nnunet

    _import_volumes(
        "importing datasets",
        import_nnunet,
        sources,
        out,
        mode=mode,
        shape=shape,
        axis=axis,
        fit=fit,
        keep_empty=keep_empty,
        normalization=normalize,
        ct_window=ct_window,
        spacing=spacing,
        interpolation=interpolation,
        site_csv=site_csv,
        site_regex=site_regex,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        seed=seed,
        task=task,
        annotation=annotation,
        overwrite=overwrite,
    )


@app.command("import-dicom")
def import_dicom_cmd(
    src: Annotated[
        Path, typer.Argument(help="One sub-folder per site (any layout inside), or see --site-tag.")
    ],
    out: Annotated[Path, typer.Argument(help="Output federation folder.")],
    classes: Classes,
    segment: Annotated[
        list[str] | None,
        typer.Option(help="SEG segment label NAME=CLASS, repeatable (default: label = class)."),
    ] = None,
    roi: Annotated[
        list[str] | None,
        typer.Option(help="RTSTRUCT ROI name NAME=CLASS, repeatable (default: name = class)."),
    ] = None,
    site_tag: Annotated[
        str | None,
        typer.Option(help="DICOM attribute naming each series' site, e.g. InstitutionName."),
    ] = None,
    mode: VolumeMode = "2d",
    shape: VolumeShape = "256",
    axis: SliceAxis = 2,
    fit: VolumeFit = None,
    keep_empty: KeepEmpty = False,
    ct_window: CtWindow = None,
    spacing: VoxelSpacing = None,
    test_fraction: Annotated[
        float, typer.Option(help="Share of each site's series as test.")
    ] = 0.2,
    val_fraction: ValFraction = 0.0,
    seed: Seed = 0,
    task: Task = "imported",
    annotation: SiteAnnotations = None,
    overwrite: Overwrite = False,
) -> None:
    """Import DICOM series with DICOM-SEG or RTSTRUCT masks (the dicom extra; docs/dicom.md)."""
    with handled():
        from fedseg.data.importers.dicom import import_dicom

        segments, rois = _assignments(segment, "--segment"), _assignments(roi, "--roi")
    result = _import_volumes(
        "importing DICOM series",
        import_dicom,
        src,
        out,
        class_names=classes.split(","),
        mode=mode,
        shape=shape,
        axis=axis,
        fit=fit,
        keep_empty=keep_empty,
        site_tag=site_tag,
        segments=segments,
        rois=rois,
        ct_window=ct_window,
        spacing=spacing,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        seed=seed,
        task=task,
        annotation=annotation,
        overwrite=overwrite,
    )
    if result.unlabelled_series:
        console.print(f"skipped {result.unlabelled_series} image series without a mask")
