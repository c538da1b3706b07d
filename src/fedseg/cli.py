"""The ``fedseg`` command line."""

from __future__ import annotations

import logging
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from fedseg.console import console, err, fail, progress
from fedseg.errors import FedsegError

app = typer.Typer(
    help="Federated and personalized-federated medical image segmentation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from fedseg import __version__

        console.print(f"fedseg {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Federated and personalized-federated medical image segmentation."""


def _mount_subapps() -> None:
    from fedseg.configs_cli import app as configs_app
    from fedseg.data.cli import app as data_app
    from fedseg.demo import demo
    from fedseg.engine.flower.cli import app as flower_app

    app.add_typer(data_app, name="data", help="Create, import, check and preview federations.")
    app.add_typer(flower_app, name="flower", help="Run a real federation on Flower.")
    app.add_typer(configs_app, name="configs", help="List, show and copy shipped configs.")
    app.command()(demo)


@app.command()
def run(
    config: Annotated[
        Path | None,
        typer.Argument(help="YAML run configuration, or a shipped name (fedseg configs list)."),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override: key.sub=value.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default runs/<name>-<time>).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory (--set may add rounds)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace the finished or failed run already in --out.")
    ] = False,
    engine: Annotated[
        str | None,
        typer.Option(
            help="Sets engine.backend: inprocess (one process) or flower-sim (Flower's "
            "simulation engine, sites in parallel; needs the flower extra)."
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Train and evaluate one method; write a run directory with results."""
    from fedseg.config import load_config
    from fedseg.errors import ConfigError
    from fedseg.run_cli import print_results, train

    try:
        if resume is not None:
            if config is not None or out is not None:
                raise ConfigError(
                    "--resume continues RUN_DIR with its own config; give no CONFIG or --out"
                )
            if not (resume / "config.yaml").is_file():
                raise ConfigError(f"--resume {resume}: no fedseg run there (no config.yaml)")
            cfg = load_config(resume / "config.yaml", set_ or [], run_dump=True)
            run_dir = resume
        elif config is not None:
            cfg = load_config(config, set_ or [])
            run_dir = out or Path("runs") / f"{cfg.name}-{datetime.now():%Y%m%d-%H%M%S}"
        else:
            raise typer.BadParameter("give a CONFIG or --resume RUN_DIR")
        if engine is not None:
            backend = cfg.engine.backend
            backend = {**backend, "name": engine} if isinstance(backend, dict) else engine
            cfg = cfg.model_copy(
                update={"engine": cfg.engine.model_copy(update={"backend": backend})}
            )
        results = train(
            cfg, run_dir, resume=resume is not None, overwrite=overwrite, verbose=verbose
        )
    except FedsegError as e:
        fail(e)
    print_results(results, run_dir)


@app.command()
def methods(pattern: Annotated[str, typer.Argument(help="Shell-style filter.")] = "*") -> None:
    """List the registered methods."""
    from fedseg.catalog import method_catalog

    table = Table("name", "personalized", "summary")
    for info in method_catalog(pattern):
        table.add_row(info.name, "yes" if info.personalized else "", info.summary)
    console.print(table)


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Finished run directories.")],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for report.md, report.csv and report.html (a path ending in .md: "
            "write only that Markdown file)."
        ),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(help="Metric to tabulate (repeatable; default dsc and hd95)."),
    ] = None,
) -> None:
    """Compare runs: one row per config (seeds pooled as mean ± std), sites and average as
    columns, one table per task; warns when rows differ in more than the method."""
    from fedseg.reporting.compare import build_report, report_markdown
    from fedseg.reporting.html import write_report
    from fedseg.reporting.runs import load_run

    metrics = tuple(metric) if metric else None
    try:
        rep = build_report([load_run(d) for d in run_dirs])
        for w in rep.warnings + [w for s in rep.sections for w in s.warnings]:
            err.print(f"[yellow]warning:[/] {escape(w)}", markup=True, highlight=False)
        if out is not None and out.suffix.lower() != ".md":
            with progress("report") as update:
                written = write_report(rep, out, metrics, progress=update)
            console.print(f"wrote {', '.join(str(p) for p in written[:3])}")
            return
        text = report_markdown(rep, metrics, base=out.parent if out is not None else None)
    except FedsegError as e:
        fail(e)
    if out is not None:
        out.write_text(text)
        console.print(f"wrote {out}")
    else:
        console.print(text, markup=False)


@app.command()
def reproduce(
    paper: Annotated[str | None, typer.Argument(help="Paper (see --list).")] = None,
    table: Annotated[str | None, typer.Argument(help="Table of the paper (see --list).")] = None,
    budget: Annotated[
        str,
        typer.Option(
            help="smoke (2 rounds, 32 px), cpu (shipped configs), evidence (the rounds at "
            "which the table's control rows converged) or paper."
        ),
    ] = "smoke",
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for the runs and table.md (default runs/reproduce/...)."),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per row (mean ± std when > 1).")] = 1,
    row: Annotated[
        list[str] | None,
        typer.Option(
            help="Only this row (label or 1-based index; repeatable); a row named here trains "
            "even where its config is measured inert at the budget."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override for every run: key.sub=value.")
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="List papers and tables.")] = False,
    evidence: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the table's page and the small files of every finished run "
            "(runs there count as done; default with --budget evidence and no --set: "
            "docs/evidence/PAPER-TABLE, which keeps the evidence budget only)."
        ),
    ] = None,
    calibrate: Annotated[
        bool,
        typer.Option(
            help="Measure the evidence budget: run the table's control rows at doubling rounds "
            "until they converge; --set items become fixed parts of the budget "
            "(docs/reproduce.md#the-evidence-budget)."
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Runs at once, each in its own process with an equal share of the CPU's "
            "threads (unless OMP_NUM_THREADS or engine.threads is set); a GPU is shared.",
        ),
    ] = 1,
    render_only: Annotated[
        bool,
        typer.Option(
            help="Train nothing: render the evidence page again from the runs kept in its "
            "folder (with --budget evidence)."
        ),
    ] = False,
    rerun: Annotated[
        bool,
        typer.Option(
            help="Train the chosen rows' runs afresh and replace their kept files in the "
            "evidence folder (kept runs are otherwise never replaced; docs/reproduce.md)."
        ),
    ] = False,
) -> None:
    """Run every row of a paper table at a budget; render it beside the published numbers
    with statistics over seeds and a verdict per claim of the paper."""
    from fedseg.reproduce import list_papers, load_paper
    from fedseg.reproduce import reproduce as run_table

    try:
        if list_ or paper is None or table is None:
            if not list_:
                raise typer.BadParameter("give PAPER and TABLE, or --list")
            listing = Table("paper", "table", "rows", "title")
            for name in list_papers():
                p = load_paper(name)
                for t in p.tables.values():
                    listing.add_row(name, t.name, str(len(t.rows)), t.title)
            console.print(listing)
            return
        from rich.logging import RichHandler

        handler = RichHandler(console=err, show_path=False, show_time=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.basicConfig(level=logging.WARNING, force=True, handlers=[handler])

        def done(name: str, _: object, seconds: float) -> None:
            err.print(f"{name}: done in {seconds:.0f}s", highlight=False)

        if calibrate:
            from fedseg.reproduce.budget import calibrate as measure

            found = measure(
                paper, table, seeds=max(seeds, 2), overrides=set_ or [], on_run=done, workers=jobs
            )
            console.print(found.report(), markup=False, soft_wrap=True)
            return
        rep = run_table(
            paper,
            table,
            budget,
            out,
            seeds,
            set_ or [],
            row,
            on_run=done,
            evidence=evidence,
            command=None if render_only else shlex.join(["fedseg", *_without_rows(sys.argv[1:])]),
            workers=jobs,
            render_only=render_only,
            rerun=rerun,
        )
    except FedsegError as e:
        fail(e)
    from fedseg.reproduce import render_markdown

    console.print(render_markdown(rep), markup=False, soft_wrap=True)
    console.print(f"wrote {rep.out / 'table.md'}, table.csv and claims.csv")
    if rep.evidence:
        console.print(f"evidence page: {rep.evidence / 'table.md'}")
    elif budget == "evidence":
        console.print("--set changes the evidence budget: no evidence page (give --evidence DIR)")


def _without_rows(args: list[str]) -> list[str]:
    """``args`` without ``--row``, ``--jobs`` and ``--rerun`` items: an evidence page shows
    every row with kept runs, and the number of processes or a rerun does not change them, so
    the command that reproduces it is the whole table's."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--row", "--jobs"):
            skip = True
        elif a != "--rerun" and not a.startswith(("--row=", "--jobs=")):
            out.append(a)
    return out


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="Finished run directory.")],
    out: Annotated[Path, typer.Option(help="Folder for <site>.pt (and global.pt).")],
    site: Annotated[
        list[str] | None,
        typer.Option(help="Site to export (repeatable; 'global': the global model)."),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Every site and the global model (the default).")
    ] = False,
    onnx: Annotated[
        bool,
        typer.Option(help="Also write <site>.onnx (images -> label maps; the onnx extra)."),
    ] = False,
    data: Annotated[
        Path | None, typer.Option(help="Federation folder, if not the run's data.root.")
    ] = None,
) -> None:
    """Write each site's evaluation model as a PyTorch state dict with its config and label
    map (and ONNX); see docs/predict.md."""
    from fedseg.export import export_run
    from fedseg.inference import RunModels

    try:
        if site and all_:
            raise typer.BadParameter("give --site or --all, not both")
        models = RunModels(run_dir, data_root=data)
        with progress("export") as update:
            names = list(site) if site else None
            written = export_run(models, out, names, onnx=onnx, progress=update)
    except FedsegError as e:
        fail(e)
    console.print(f"wrote {', '.join(str(p) for p in written)}")


@app.command()
def predict(
    source: Annotated[
        Path,
        typer.Argument(help="Run directory, or a <site>.pt (or its <site>.onnx) from export."),
    ],
    input_: Annotated[
        Path,
        typer.Option("--input", help="Folder of PNG/JPG images, NIfTI volumes or DICOM series."),
    ],
    out: Annotated[Path, typer.Option(help="Folder for the masks.")],
    site: Annotated[
        str | None, typer.Option(help="Site whose model predicts ('global': the global model).")
    ] = None,
    fit: Annotated[
        str,
        typer.Option(
            help="Volumes of a 3D model: window (sliding windows of the training size) or "
            "resize (to the training size, for data imported with resizing)."
        ),
    ] = "window",
    overlap: Annotated[float, typer.Option(help="Sliding-window overlap (0 to <1).")] = 0.5,
    axis: Annotated[
        int, typer.Option(help="Volume axis that came first at import (2: axial).")
    ] = 2,
    batch_size: Annotated[int, typer.Option(help="Images or windows per forward pass.")] = 4,
    data: Annotated[
        Path | None, typer.Option(help="Federation folder, if not the run's data.root.")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "cpu",
    output_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto (PNG for images, NIfTI for volumes) or dicom-seg (input: DICOM series; "
            "one DICOM-SEG per series, the dicom extra).",
        ),
    ] = "auto",
    ct_window: Annotated[
        str | None,
        typer.Option(help="LOW,HIGH in HU: volumes scaled as the import's --ct-window did."),
    ] = None,
    spacing: Annotated[
        str | None,
        typer.Option(help="mm, as the import's --spacing: volumes resampled, masks back."),
    ] = None,
) -> None:
    """Segment new images with a site's model: PNG masks (label values) for images, NIfTI
    masks with the input's header for volumes, DICOM-SEGs for DICOM series (--format
    dicom-seg); see docs/predict.md."""
    from fedseg.engine.device import resolve_device
    from fedseg.errors import ConfigError
    from fedseg.export import load_exported
    from fedseg.inference import RunModels, predict_files

    try:
        dev = resolve_device(device, "--device")
        if not source.exists():
            raise ConfigError(f"{source}: no such run directory or exported model")
        if source.is_file():
            model = load_exported(source, dev)
            if site is not None and site != model.info.site:
                raise ConfigError(
                    f"--site {site!r}: {source} holds the model of {model.info.site!r}"
                )
        else:
            if site is None:
                raise ConfigError("--site is needed with a run directory")
            model = RunModels(source, device=dev, data_root=data).site_model(site)
        if not 0 <= overlap < 1:
            raise ConfigError(f"--overlap must lie in [0, 1), got {overlap}")
        from fedseg.data.cli import _floats, _window

        voxel = None if spacing is None else _floats(spacing, "--spacing")
        if voxel is not None and len(voxel) == 1:
            voxel *= model.info.ndim
        written = predict_files(
            model,
            input_,
            out,
            fit=fit,  # type: ignore[arg-type]
            overlap=overlap,
            axis=axis,
            batch_size=batch_size,
            output_format=output_format,  # type: ignore[arg-type]
            ct_window=_window(ct_window),
            spacing=voxel,
        )
    except FedsegError as e:
        fail(e)
    console.print(f"wrote {len(written)} masks to {out}")


_mount_subapps()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
