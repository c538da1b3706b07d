"""A site's private state on disk, one atomic file per finished round: a Flower site's own
store, and the in-process engine's with ``engine.site_states: disk``.

After its client step of round ``r`` a site writes ``round-<r>.pt`` (atomically: a crash
leaves the old files intact) and prunes all but the newest ``keep`` files. A step of round
``r`` always starts from the newest state of an *earlier* round, so a server that resumes
from an older checkpoint and replays a round gets the same inputs as the first time. The
state this store saved last is also kept in memory, so a long-lived site process does not
read back the file it has just written (``cache=False``: nothing is kept in memory). The
state before round 1 may be saved as round -1 (``initial.pt``, never pruned).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import torch

from fedseg.engine.rundir import atomic_write_bytes
from fedseg.errors import DataError

__all__ = ["SiteStateStore"]

_FILE = re.compile(r"^round-(\d+)\.pt$")


class SiteStateStore:
    """Private states of one site in one run, under ``root``, keeping the newest ``keep``
    files (a :class:`~fedseg.engine.worker.StateStore`)."""

    replays = True

    def __init__(self, root: Path, keep: int = 2, cache: bool = True) -> None:
        self.root = Path(root)
        self.keep = max(keep, 1)
        self.cache = cache
        self._last: tuple[int, dict[str, Any]] | None = None

    def rounds(self) -> list[int]:
        """Rounds with a saved state, oldest first (-1: the state before round 1)."""
        if not self.root.is_dir():
            return []
        found = (_FILE.match(p.name) for p in self.root.iterdir())
        initial = [-1] if self.path(-1).is_file() else []
        return initial + sorted(int(m.group(1)) for m in found if m)

    def path(self, r: int) -> Path:
        return self.root / ("initial.pt" if r < 0 else f"round-{r:05d}.pt")

    def save(self, r: int, state: dict[str, Any]) -> Path:
        """Write the state after round ``r`` and keep only the newest ``keep`` files."""
        buf = io.BytesIO()
        torch.save(state, buf)
        path = self.path(r)
        atomic_write_bytes(path, buf.getvalue())
        for old in [k for k in self.rounds() if k >= 0][: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        if self.cache:
            self._last = (r, state)
        return path

    def latest_before(self, r: int) -> tuple[int, dict[str, Any]] | None:
        """``(round, state)`` of the newest saved round before ``r``, or None. Files are
        loaded as tensors and plain data only (no code runs)."""
        earlier = [k for k in self.rounds() if k < r]
        if not earlier:
            return None
        k = earlier[-1]
        if self._last is not None and self._last[0] == k:
            return self._last
        try:
            return k, torch.load(self.path(k), map_location="cpu", weights_only=True)
        except Exception as e:  # damaged or unsafe file: never executed, always named
            why = str(e).splitlines()[0][:160]
            raise DataError(
                f"{self.path(k)}: cannot read this site's saved state ({why})"
            ) from None
