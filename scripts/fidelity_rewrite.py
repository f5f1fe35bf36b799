"""Rewrite a LangChain test module so every chain it calls runs through ``TeolaRunnable``.

Inside each test function, a call ``X.invoke(...)`` (and ``ainvoke``, ``batch``, ``stream``,
``astream_events``... see ``RUNNABLE_METHODS``) becomes ``_teola_wrap(X).invoke(...)``;
``_teola_wrap`` wraps a Runnable in a ``TeolaRunnable`` (one wrapper per object, so its
traces are cached as a user's would be) and returns anything else unchanged. Assertions are
not touched. Functions, lambdas and classes a test defines are left alone: they are the
chain's code (a ``RunnableLambda`` calling another chain, a Runnable subclass calling
``self.invoke`` inside its own ``invoke``), not call sites of the test.

    python scripts/fidelity_rewrite.py tests/unit_tests/runnables/test_runnable.py > wrapped.py
"""

from __future__ import annotations

import ast
import sys

RUNNABLE_METHODS = frozenset({
    "invoke", "ainvoke", "batch", "abatch", "batch_as_completed", "abatch_as_completed",
    "stream", "astream", "astream_log", "astream_events", "transform", "atransform",
})
WRAP = "_teola_wrap"

# Imported with the test module, as an app imports it: not inside a test's event loop.
PRELUDE = f'''
from langchain_core.runnables import Runnable as _TeolaRunnableBase
from teola_plugin.langchain import TeolaRunnable as _TeolaRunnable

_TEOLA_WRAPPED = {{}}
_TEOLA_OPTIONS = {{OPTIONS}}


def {WRAP}(obj):
    """(fidelity harness) ``obj`` as a TeolaRunnable when it is a Runnable."""
    if not isinstance(obj, _TeolaRunnableBase) or isinstance(obj, _TeolaRunnable):
        return obj
    kept = _TEOLA_WRAPPED.get(id(obj))
    if kept is None or kept[0] is not obj:  # ids are reused once an object is gone; keep it
        kept = _TEOLA_WRAPPED[id(obj)] = (obj, _TeolaRunnable(obj, **_TEOLA_OPTIONS))
    return kept[1]
'''


class _CallSites(ast.NodeVisitor):
    """The receivers ``X`` of the runnable-method calls ``X.invoke(...)`` a test makes."""

    def __init__(self) -> None:
        self.in_test = False
        self.depth = 0  # definitions entered
        self.receivers: list[ast.expr] = []

    def _scope(self, node: ast.AST) -> None:
        """A module-level test function's body is the test; anything it defines is not."""
        outer = self.in_test
        self.in_test = (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not outer
                        and node.name.startswith("test") and self.depth == 0)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        self.in_test = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope  # noqa: N815

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (self.in_test and isinstance(func, ast.Attribute) and func.attr in RUNNABLE_METHODS
                and not _is_super(func.value)):
            self.receivers.append(func.value)
        self.generic_visit(node)


def _is_super(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def rewrite(source: str, options: dict | None = None) -> tuple[str, int]:
    """``(rewritten source, number of call sites wrapped)``; ``options`` are TeolaRunnable's
    keyword arguments. Edits are made in place in the text (the rest of the file keeps its
    layout: LangChain reads lambdas' source lines)."""
    tree = ast.parse(source)
    sites = _CallSites()
    sites.visit(tree)
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    edits = [(n.lineno, n.col_offset, f"{WRAP}(") for n in sites.receivers]
    edits += [(n.end_lineno, n.end_col_offset, ")") for n in sites.receivers]
    for lineno, col, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):  # byte offsets
        line = lines[lineno - 1]
        lines[lineno - 1] = line[:col] + text.encode() + line[col:]
    body, after = tree.body, 0  # the prelude goes after the docstring and ``from __future__``
    while after < len(body) and (_is_docstring(body[after]) or _is_future(body[after])):
        after += 1
    at = body[after - 1].end_lineno if after else 0
    lines.insert(at, PRELUDE.replace("{OPTIONS}", repr(dict(options or {}))).encode())
    return b"".join(lines).decode(), len(sites.receivers)

def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(rewrite(f.read())[0])
