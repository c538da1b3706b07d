"""What ``fedseg methods`` lists, read from the method modules' source without importing them.

Importing the methods imports torch (seconds); listing them should not. Each module of
``fedseg/methods`` is parsed, and every class decorated with ``@register_method("name")`` is
read for its ``personalized`` and ``summary`` class attributes (literals), following base
classes defined in the same package. ``tests/core/test_catalog.py`` checks the result against
the imported registry, so the two cannot drift.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MethodInfo", "method_catalog"]

METHODS_DIR = Path(__file__).parent / "methods"


@dataclass(frozen=True)
class MethodInfo:
    """One registered method as ``fedseg methods`` shows it."""

    name: str
    personalized: bool
    summary: str
    module: str


@dataclass
class _Class:
    bases: list[str]
    attrs: dict[str, object]
    doc: str
    registered: str | None
    module: str


def _literal_attrs(node: ast.ClassDef) -> dict[str, object]:
    attrs: dict[str, object] = {}
    for stmt in node.body:
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and target.id in ("personalized", "summary"):
            try:
                attrs[target.id] = ast.literal_eval(value)  # type: ignore[arg-type]
            except ValueError:
                continue  # computed at import time: the base class's value stands
    return attrs


def _registered_name(node: ast.ClassDef) -> str | None:
    for dec in node.decorator_list:
        if (
            isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Name)
            and dec.func.id == "register_method"
            and dec.args
            and isinstance(dec.args[0], ast.Constant)
        ):
            return str(dec.args[0].value)
    return None


def _classes(directory: Path) -> dict[str, _Class]:
    found: dict[str, _Class] = {}
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[node.name] = _Class(
                    bases=[b.id for b in node.bases if isinstance(b, ast.Name)],
                    attrs=_literal_attrs(node),
                    doc=ast.get_docstring(node) or "",
                    registered=_registered_name(node),
                    module=path.stem,
                )
    return found


def _lookup(classes: dict[str, _Class], name: str, attr: str, default: object) -> object:
    """``attr`` along the method resolution order (depth-first, left to right)."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop(0)
        if current in seen or current not in classes:
            continue
        seen.add(current)
        cls = classes[current]
        if attr in cls.attrs:
            return cls.attrs[attr]
        stack[:0] = cls.bases
    return default


def method_catalog(pattern: str = "*", directory: Path = METHODS_DIR) -> list[MethodInfo]:
    """Registered methods matching the shell-style ``pattern``, sorted by name."""
    import fnmatch

    classes = _classes(directory)
    out = []
    for cls_name, cls in classes.items():
        if cls.registered is None or not fnmatch.fnmatchcase(cls.registered, pattern):
            continue
        summary = str(_lookup(classes, cls_name, "summary", "")) or cls.doc.split("\n")[0]
        out.append(
            MethodInfo(
                name=cls.registered,
                personalized=bool(_lookup(classes, cls_name, "personalized", False)),
                summary=summary,
                module=cls.module,
            )
        )
    return sorted(out, key=lambda m: m.name)
