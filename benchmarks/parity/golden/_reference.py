"""Shared helpers of the golden-fixture generators (``make_<name>.py``).

A generator checks out one pinned commit of the authors' repository from a local git
directory (a clone's ``.git`` or a bare mirror), imports the reference function from that
checkout, runs it on fixed seeded inputs and writes inputs and outputs, numbers only, to
``tests/fixtures/golden/<name>.npz`` together with a JSON ``meta`` entry naming the
repository, commit and function. The authors' code is run from the checkout; nothing of it
is copied into fedseg.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "golden"


def parse_git_dir(repo: str, description: str) -> Path:
    """The ``--git-dir`` argument of a generator (a clone's ``.git`` or a bare mirror of
    ``repo``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--git-dir",
        type=Path,
        required=True,
        help=f"git directory of a clone of github.com/{repo} (its .git, or a bare mirror)",
    )
    return parser.parse_args().git_dir


def checkout(git_dir: Path, commit: str, paths: Sequence[str]) -> Path:
    """Extract ``paths`` of ``commit`` from ``git_dir`` into a fresh temporary directory
    (removed when the generator exits)."""
    try:
        full = subprocess.run(
            ["git", f"--git-dir={git_dir}", "rev-parse", "--verify", f"{commit}^{{commit}}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        blob = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", full, *paths],
            check=True,
            capture_output=True,
        ).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"{git_dir}: cannot read {list(paths)} at commit {commit}: {e.stderr!r}")
    dest = Path(tempfile.mkdtemp(prefix="golden-ref-"))
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def load_module(root: Path, relpath: str, name: str, search: Sequence[str] = ("",)) -> ModuleType:
    """Import ``root/relpath`` as module ``name``, with ``root/<s>`` for each of ``search``
    first on ``sys.path`` (the authors' own absolute imports)."""
    for s in search:
        sys.path.insert(0, str(root / s))
    spec = importlib.util.spec_from_file_location(name, root / relpath)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot import {root / relpath}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _assigns(node: ast.AST, name: str) -> bool:
    """Whether ``node`` (a statement) or a statement inside it assigns the name ``name``."""
    return any(
        isinstance(x, ast.Name) and x.id == name
        for n in ast.walk(node)
        if isinstance(n, ast.Assign)
        for x in n.targets
    )


def statements(source: str, function: str, start: str, stop: str) -> str:
    """The source of the consecutive statements of ``function`` (a function or method of
    ``source``) from the one that assigns ``start`` directly through the first that assigns
    ``stop`` (directly or inside it), taken from one block, for a reference computation that
    is written inline rather than as a function."""
    fns = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
    ]
    if len(fns) != 1:
        sys.exit(f"expected one function {function!r}, found {len(fns)}")
    found = []
    for node in ast.walk(fns[0]):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            direct = isinstance(stmt, ast.Assign) and _assigns(stmt, start)
            if direct:
                j = next((k for k in range(i, len(body)) if _assigns(body[k], stop)), None)
                if j is not None:
                    found.append(body[i : j + 1])
    if len(found) != 1:
        sys.exit(f"{function}: expected one block from {start!r} to {stop!r}, found {len(found)}")
    return "\n".join(ast.unparse(s) for s in found[0])


def write_fixture(
    name: str,
    *,
    repository: str,
    commit: str,
    function: str,
    arrays: Mapping[str, np.ndarray],
    notes: str = "",
) -> Path:
    """Write ``arrays`` and a JSON ``meta`` string to ``tests/fixtures/golden/<name>.npz``."""
    meta = {
        "repository": f"github.com/{repository}",
        "commit": commit,
        "function": function,
        "generator": f"benchmarks/parity/golden/make_{name}.py",
        "notes": notes,
    }
    FIXTURES.mkdir(parents=True, exist_ok=True)
    out = FIXTURES / f"{name}.npz"
    clean = {k: np.asarray(v) for k, v in arrays.items()}
    bad = [k for k, v in clean.items() if v.dtype == object]
    if bad:
        raise TypeError(f"fixture {name}: arrays {bad} are not numeric")
    np.savez_compressed(out, meta=np.array(json.dumps(meta, sort_keys=True)), **clean)
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size} bytes)")
    return out
