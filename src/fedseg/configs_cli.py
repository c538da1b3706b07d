"""``fedseg configs``: list, show and copy the run configurations shipped with fedseg."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

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


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


@app.command("list")
def list_(pattern: Annotated[str, typer.Argument(help="Substring filter.")] = "") -> None:
    """The shipped configurations (run one with `fedseg run NAME`). Names are never cut; the
    description is shortened to the width that is left (`fedseg configs show NAME`)."""
    rows = [(n, *_describe(resolve_config(n))) for n in packaged_configs() if pattern in n]
    if not rows:
        fail(ConfigError(f"no shipped config name contains {pattern!r}; see fedseg configs list"))
    rows.insert(0, ("name", "method", "task", "description"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    room = max(console.width - sum(widths) - 2 * 3, 10)  # two spaces between columns
    for k, (*fixed, description) in enumerate(rows):
        line = "  ".join(f"{v:<{w}}" for v, w in zip(fixed, widths, strict=True))
        style = "bold" if k == 0 else None
        console.print(
            f"{line}  {_shorten(description, room)}".rstrip(),
            style=style,
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print("the whole of one: fedseg configs show NAME", style="dim", highlight=False)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Shipped config name, e.g. quickstart.")],
) -> None:
    """Print a shipped configuration as it is on disk (never wrapped: `> my.yaml` keeps it
    valid YAML)."""
    try:
        text = resolve_config(name).read_text()
    except FedsegError as e:
        fail(e)
    sys.stdout.write(text)


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
