"""The docs stay true to the code: every exception the library defines is in
docs/troubleshooting.md, and the "what is traced" tables of docs/integrations.md are what
scripts/gen_integrations_doc.py derives from the lowering-rule registries now."""

from __future__ import annotations

import ast
import builtins
import inspect
import subprocess
import sys
from pathlib import Path

from teola_plugin import errors

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "teola_plugin"


def exception_classes_in_source() -> dict[str, str]:
    """Every public class the package defines that derives from an exception (found in the
    source, so no module needs importing): name -> defining file."""
    builtin_errors = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                classes[node.name] = (str(path.relative_to(ROOT)), bases)
    found: dict[str, str] = {}
    changed = True
    while changed:  # a class is an exception if one of its bases is
        changed = False
        for name, (where, bases) in classes.items():
            if name not in found and any(b in builtin_errors or b in found for b in bases):
                found[name] = where
                changed = True
    return found


def test_every_exception_class_is_in_troubleshooting():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    defined = exception_classes_in_source()
    in_errors = {n for n, v in vars(errors).items() if inspect.isclass(v) and issubclass(v, BaseException)
                 and v.__module__ == errors.__name__}
    assert in_errors <= set(defined) and "QueryTimeoutError" in in_errors  # the scan sees errors.py
    missing = sorted(f"{name} ({where})" for name, where in defined.items() if f"`{name}`" not in doc)
    assert not missing, f"exception classes not documented in docs/troubleshooting.md: {missing}"


def test_every_class_in_errors_has_its_own_section():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    for name, value in vars(errors).items():
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__:
            assert f"### `{name}`" in doc, f"docs/troubleshooting.md needs a '### `{name}`' section"


def test_integrations_doc_matches_the_rule_registries():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_integrations_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
