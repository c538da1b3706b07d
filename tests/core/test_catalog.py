"""``fedseg methods`` reads the registry from source: it must agree with the imported one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedseg.catalog import method_catalog
from fedseg.methods import get_method, list_methods


def test_catalog_equals_the_imported_registry() -> None:
    catalog = {m.name: m for m in method_catalog()}
    assert sorted(catalog) == sorted(list_methods())
    for name, info in catalog.items():
        cls = get_method(name)
        assert info.personalized == cls.personalized, name
        assert info.summary == (cls.summary or (cls.__doc__ or "").split("\n")[0]), name
        assert cls.__module__ == f"fedseg.methods.{info.module}"
    assert [m.name for m in method_catalog("fed*p*")] == list_methods("fed*p*")


def test_listing_methods_does_not_import_torch() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from fedseg.cli import app; "
        "r = CliRunner().invoke(app, ['methods']); assert r.exit_code == 0, r.output; "
        "assert 'fedavg' in r.output and 'fedlppa' in r.output, r.output; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_new_module_is_found_with_inherited_attributes(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("class Method:\n    personalized = False\n    summary = ''\n")
    (tmp_path / "mine.py").write_text(
        "@register_method('parent')\nclass Parent(Method):\n    personalized = True\n"
        "    summary = 'the parent'\n\n"
        "@register_method('child')\nclass Child(Parent):\n    '''Child doc.\n\n    More.'''\n"
        "    summary = ''\n\n"
        "@register_method('heir')\nclass Heir(Parent):\n    pass\n"
    )
    found = {m.name: m for m in method_catalog(directory=tmp_path)}
    assert found["parent"].personalized and found["parent"].summary == "the parent"
    assert found["child"].personalized and found["child"].summary == "Child doc."
    assert found["heir"].summary == "the parent"
