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

PRELUDE = f'''
_TEOLA_WRAPPED = {{}}


def {WRAP}(obj):
    """(fidelity harness) ``obj`` as a TeolaRunnable when it is a Runnable."""
    from langchain_core.runnables import Runnable
    from teola_plugin.langchain import TeolaRunnable

    if not isinstance(obj, Runnable) or isinstance(obj, TeolaRunnable):
        return obj
    kept = _TEOLA_WRAPPED.get(id(obj))
    if kept is None or kept[0] is not obj:  # ids are reused once an object is gone; keep it
        kept = _TEOLA_WRAPPED[id(obj)] = (obj, TeolaRunnable(obj))
    return kept[1]
'''


class _WrapCallSites(ast.NodeTransformer):
    def __init__(self) -> None:
        self.in_test = False
        self.depth = 0  # definitions entered
        self.rewritten = 0

    def _scope(self, node: ast.AST) -> ast.AST:
        """A module-level test function's body is the test; anything it defines is not."""
        outer = self.in_test
        self.in_test = (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not outer
                        and node.name.startswith("test") and self.depth == 0)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        self.in_test = outer
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope  # noqa: N815

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (self.in_test and isinstance(func, ast.Attribute) and func.attr in RUNNABLE_METHODS
                and not _is_super(func.value)):
            func.value = ast.Call(func=ast.Name(WRAP, ast.Load()), args=[func.value], keywords=[])
            self.rewritten += 1
        return node


def _is_super(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def rewrite(source: str) -> tuple[str, int]:
    """``(rewritten source, number of call sites wrapped)``."""
    tree = ast.parse(source)
    sites = _WrapCallSites()
    tree = sites.visit(tree)
    body = tree.body
    after = 0  # after the docstring and ``from __future__`` imports
    while after < len(body) and (_is_docstring(body[after]) or _is_future(body[after])):
        after += 1
    tree.body = body[:after] + ast.parse(PRELUDE).body + body[after:]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", sites.rewritten


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(rewrite(f.read())[0])
