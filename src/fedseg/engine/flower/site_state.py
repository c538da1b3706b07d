"""A site's private state on its own disk, one atomic file per finished round.

After its client step of round ``r`` a site writes ``round-<r>.pt`` (atomically: a crash
leaves the old files intact) and prunes all but the newest ``keep`` files. A step of round
``r`` always starts from the newest state of an *earlier* round, so a server that resumes
from an older checkpoint and replays a round gets the same inputs as the first time.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import torch

from fedseg.engine.rundir import atomic_write_bytes
from fedseg.methods import State

__all__ = ["SiteStateStore"]

_FILE = re.compile(r"^round-(\d+)\.pt$")


class SiteStateStore:
    """Private states of one site in one run, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def rounds(self) -> list[int]:
        """Rounds with a saved state, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_FILE.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def path(self, r: int) -> Path:
        return self.root / f"round-{r:05d}.pt"

    def save(self, r: int, state: State, keep: int = 2) -> Path:
        """Write the state after round ``r`` and keep only the newest ``keep`` files."""
        buf = io.BytesIO()
        torch.save(state, buf)
        path = self.path(r)
        atomic_write_bytes(path, buf.getvalue())
        for old in self.rounds()[: -max(keep, 1)]:
            self.path(old).unlink(missing_ok=True)
        return path

    def latest_before(self, r: int) -> tuple[int, State] | None:
        """``(round, state)`` of the newest saved round before ``r``, or None."""
        earlier = [k for k in self.rounds() if k < r]
        if not earlier:
            return None
        k = earlier[-1]
        return k, torch.load(self.path(k), map_location="cpu", weights_only=False)
