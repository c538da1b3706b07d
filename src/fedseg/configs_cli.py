"""``fedseg configs``: list, show and copy the run configurations shipped with fedseg."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.table import Table

from fedseg.configs import packaged_configs, resolve_config
from fedseg.console import console, fail
from fedseg.errors import ConfigError, FedsegError

app = typer.Typer(no_args_is_help=True)


def _describe(path: Path) -> tuple[str, str, str]:
    raw = yaml.safe_load(path.read_text()) or {}
    first = next((ln for ln in path.read_text().splitlines() if ln.startswith("#")), "")
    method = (raw.get("method") or {}).get("name", "")
    task = ((raw.get("data") or {}).get("synth") or {}).get("task", "")
    return method, task, first.lstrip("# ").strip()


@app.command("list")
def list_(pattern: Annotated[str, typer.Argument(help="Substring filter.")] = "") -> None:
    """The shipped configurations (run one with `fedseg run NAME`)."""
    table = Table("name", "method", "task", "description")
    for name in packaged_configs():
        if pattern in name:
            table.add_row(name, *_describe(resolve_config(name)))
    console.print(table)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Shipped config name, e.g. quickstart.")],
) -> None:
    """Print a shipped configuration."""
    try:
        console.print(resolve_config(name).read_text(), markup=False, highlight=False)
    except FedsegError as e:
        fail(e)


@app.command()
def copy(
    name: Annotated[str, typer.Argument(help="Shipped config name, e.g. quickstart.")],
    dest: Annotated[Path, typer.Argument(help="File to write (refused if it exists).")],
) -> None:
    """Copy a shipped configuration to DEST to edit it."""
    try:
        src = resolve_config(name)
        if dest.exists():
            raise ConfigError(f"{dest} exists; choose another file")
        shutil.copyfile(src, dest)
    except (FedsegError, OSError) as e:
        fail(e if isinstance(e, FedsegError) else ConfigError(f"cannot write {dest}: {e}"))
    console.print(f"wrote {dest}")
