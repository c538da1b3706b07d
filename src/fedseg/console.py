"""Terminal output shared by the ``fedseg`` command groups: one console, one error style."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedseg.errors import FedsegError

__all__ = ["console", "err", "fail", "handled", "progress"]

console = Console()
err = Console(stderr=True)


def fail(e: FedsegError) -> NoReturn:
    """Print the error's reason (unwrapped, so paths stay whole) and exit with status 2."""
    err.print(f"[bold red]error:[/] {escape(e.reason)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


@contextmanager
def handled() -> Iterator[None]:
    """Turn a :class:`FedsegError` raised inside the block into :func:`fail`."""
    try:
        yield
    except FedsegError as e:
        fail(e)


@contextmanager
def progress(what: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr (gone when done; drawn only on a terminal) out of ``total``
    (unknown: ``None``); yields ``update(done, total=None)`` (a ``total`` replaces it)."""
    with Progress(
        TextColumn(f"[bold]{escape(what)}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done, total=None: bar.update(task, completed=done, total=total)
