"""No tracked file cites the project's working notes: a clone has no ``shared/`` folder.

Docs, protocol sheets and code cite the paper itself (authors, venue, section, table) or a
public repository at a commit.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Built from parts so that this file does not hold the strings it looks for.
FORBIDDEN = tuple("shared/" + folder for folder in ("papers", "research", "notes"))


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name and not name.startswith("tests/")]


def test_no_tracked_file_cites_the_shared_folder() -> None:
    hits = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted from the work tree but still in the index
        for number, line in enumerate(text.splitlines(), 1):
            if any(s in line for s in FORBIDDEN):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "cite the paper (authors, venue, section, table) instead of:\n" + "\n".join(
        hits
    )
