"""``fedseg configs list`` at 80 columns: every name whole, descriptions shortened."""

from __future__ import annotations

import os
import subprocess
import sys

from fedseg.configs import packaged_configs


def _list(columns: int, *args: str) -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    out = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "configs", "list", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_names_are_whole_and_lines_fit_80_columns() -> None:
    lines = _list(80)
    first_words = [ln.split()[0] for ln in lines[1:-1]]
    assert first_words == packaged_configs()  # every name whole, in order, one line each
    longest = max(packaged_configs(), key=len)
    assert len(longest) > 30  # the names that used to be cut
    assert all(len(ln) <= 80 for ln in lines), max(lines, key=len)
    assert any(ln.endswith("…") for ln in lines)  # descriptions are shortened instead
    wide = _list(200, "quickstart")
    assert not wide[1].endswith("…") and len(wide[1]) > 80  # room: the whole description
