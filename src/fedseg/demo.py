"""``fedseg demo``: what fedseg is for, in about three minutes on a CPU.

One synthetic OCTA federation (4 sites, the foveal avascular zone, FAZ, as in FedLPPA's
Table III) whose sites hold the different weak annotations of the FedLPPA paper; a
personalised weak-label method (FedLPPA) against FedAvg and local training, all on the same
budget; the side-by-side table, the report and what to try next.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from fedseg.console import console, fail
from fedseg.errors import FedsegError

if TYPE_CHECKING:
    from fedseg.config import RunConfig
    from fedseg.reporting.compare import Section

__all__ = ["BUDGET", "METHODS", "demo"]

METHODS = {"local": "LT (local)", "fedavg": "FedAvg", "fedlppa": "FedLPPA"}
"""Config name and method of each run -> how the tables name it."""

BUDGET = ("data.synth.task=faz", "train.rounds=8", "train.local_iters=5", "engine.amp=off")
"""Task and training budget of every method (on top of the ``quickstart`` config), the same
for all: the three minutes on two CPU cores fix 8 x 5 steps; the task was chosen on the
control rows only (local training and FedAvg must each reach 10 % DSC at every site; the
fundus task at 64 and 48 px and the polyp task did not, FAZ did:
benchmarks/demo_calibration.sh, docs/benchmarks.md); float32 (``engine.amp=off``), so
machines with native bf16 print what the others do."""


def demo(
    out: Annotated[Path, typer.Option(help="Folder for the data, the runs and the report.")] = Path(
        "runs/demo"
    ),
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override for every run (e.g. train.rounds=20)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Compare FedLPPA (personalised, weak labels) with FedAvg and local training on one
    weakly labelled FAZ federation; print the table, write report.html."""
    from fedseg.config import dump_config, load_config
    from fedseg.reporting.compare import build_report
    from fedseg.reporting.html import write_report
    from fedseg.reporting.runs import load_run
    from fedseg.run_cli import train

    config = out / "demo.yaml"
    try:
        base = load_config("quickstart", [f"data.root={out / 'data'}", *BUDGET, *(set_ or [])])
        out.mkdir(parents=True, exist_ok=True)
        config.write_text(
            "# fedseg demo: the quickstart federation at the demo's budget; each run sets\n"
            "# name and method.name (fedseg run demo.yaml --set method.name=...).\n"
            + dump_config(base.model_copy(update={"name": "demo"}))
        )
        _introduce(base, out / "data")
        for k, (method, label) in enumerate(METHODS.items(), start=1):
            cfg = load_config(config, [f"name={method}", f"method.name={method}"])
            start = time.perf_counter()
            results = train(
                cfg, out / method, overwrite=True, verbose=verbose, quiet=True, label=label
            )
            dsc = ", ".join(f"{r} {100 * v:.1f}" for r, v in results["average"]["dsc"].items())
            console.print(
                f"[{k}/{len(METHODS)}] {label}: {time.perf_counter() - start:.0f} s, "
                f"average DSC (%) {dsc}",
                highlight=False,
            )
        report = build_report([load_run(out / m) for m in METHODS])
        write_report(report, out / "report")
    except FedsegError as e:
        fail(e)
    section = report.sections[0]
    for region in section.regions:
        console.print(_region_table(section, region, out / "local"))
    for w in report.warnings + section.warnings:
        console.print(f"warning: {w}", style="yellow", highlight=False, soft_wrap=True)
    _next_steps(out, config)


def _introduce(cfg: RunConfig, data: Path) -> None:
    synth, train = cfg.data.synth, cfg.train
    sites = f"{synth.sites} synthetic {synth.task} sites" if synth else "the sites"
    console.print(
        f"fedseg demo: {sites} in {data}, each with its own kind of weak label (the FedLPPA "
        f"paper's); {', '.join(METHODS.values())} each train {train.rounds} rounds x "
        f"{train.local_iters} local iterations on the weak labels and are tested on full masks.",
        highlight=False,
        soft_wrap=True,
    )


def _region_table(section: Section, region: str, run_dir: Path) -> Table:
    """DSC (%) of ``region`` per site (with its annotation) and on average, one line per
    method."""
    from fedseg.reporting.runs import site_facts

    facts = site_facts(run_dir)
    table = Table(title=f"DSC (%) of {region}, test cases, full masks", title_justify="left")
    table.add_column("method")
    for site in section.sites:
        kind = facts[site].annotation if site in facts else ""
        table.add_column(f"{site}\n{kind}", justify="right")
    table.add_column("Average", justify="right")
    for row in section.rows:
        cells = [row.cell("dsc", s, region) for s in [*section.sites, "Average"]]
        table.add_row(METHODS.get(row.name, row.label), *cells)
    return table


def _next_steps(out: Path, config: Path) -> None:
    runs = " ".join(str(out / m) for m in METHODS)
    steps = [
        (
            "another method on the same data",
            f"fedseg run {config} --set name=fedprox --set method.name=fedprox "
            f"--out {out / 'fedprox'}",
        ),
        ("all four side by side", f"fedseg report {runs} {out / 'fedprox'} --out {out / 'report'}"),
        (
            "masks for new images",
            f"fedseg predict {out / 'fedlppa'} --site A --input DIR --out masks/",
        ),
        ("every method, every shipped config", "fedseg methods; fedseg configs list"),
    ]
    console.print(
        f"\nreport (tables, learning curves, segmentations): {out / 'report' / 'report.html'}",
        highlight=False,
        soft_wrap=True,
    )
    console.print("next:", style="bold")
    for what, command in steps:
        console.print(f"  {what}:\n    {command}", highlight=False, soft_wrap=True)
