"""Terminal output shared by the ``fedseg`` command groups: one console, one error style."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from fedseg.errors import FedsegError

__all__ = ["console", "err", "fail", "handled"]

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
