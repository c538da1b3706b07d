"""No tracked file cites the project's working notes: a clone has no ``shared/`` folder.

Docs, protocol sheets and code cite the paper itself (authors, venue, section, table) or a
public repository at a commit.
"""

import re
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


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_markdown_resolves() -> None:
    """A page moved (e.g. into docs/evidence/archive/) leaves no link to its old place."""
    broken = []
    for path in _tracked_files():
        if path.suffix != ".md" or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                target = target.split("#")[0]
                if not target or "://" in target or target.startswith("mailto:"):
                    continue
                if not (path.parent / target).exists():
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
