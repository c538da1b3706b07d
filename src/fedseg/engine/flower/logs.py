"""Logging of the Flower apps: fedseg's records to stdout (streamed by ``flwr run --stream``
and captured in SuperNode logs) and, on the server, to the run directory's ``run.log``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

__all__ = ["configure_logging"]


def configure_logging(run_dir: Path | None = None) -> None:
    """Route the ``fedseg`` logger to stdout and, given a run directory, to its run.log."""
    logger = logging.getLogger("fedseg")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(run_dir / "run.log"))
    for h in logger.handlers[:]:
        logger.removeHandler(h)
    for h in handlers:
        h.setFormatter(logging.Formatter("%(asctime)s fedseg %(levelname)s: %(message)s", "%X"))
        logger.addHandler(h)
