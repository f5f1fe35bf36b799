"""Dependency pruning: keep only the waits that are real.

A tracer records the framework's module order as control dependencies (``after``), so
the query embedding waits for document ingestion although it never reads the index.
Data edges are real and stay (vector_search reads the INDEX handle that vector_insert
returns, so it still waits for the data). Control edges are dropped, except between
two impure primitives: side effects keep their order. An impure node's wait on a pure
node stands for the impure nodes that pure node (transitively) waited on, so those are
what it keeps.

Purity is the contract here: a pure primitive has no side effects and reads external
state only through its data inputs.
"""

from __future__ import annotations

from ...ir.graph import PGraph
from ..context import PassContext

NAME = "prune_dependencies"
DESCRIPTION = "drop control dependencies that are not data dependencies (side effects keep their order)"


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    # For each pure node, the nearest impure nodes it was ordered after (data or control).
    impure_before: dict[str, frozenset[str]] = {}
    new_after: dict[str, frozenset[str]] = {}
    for prim in graph.nodes:
        if prim.pure:
            impure_before[prim.name] = frozenset().union(*(
                {q} if not graph[q].pure else impure_before[q] for q in graph.predecessors(prim.name)))
            if prim.after:
                new_after[prim.name] = frozenset()
            continue
        keep: set[str] = set()
        for target in prim.after:
            keep |= {target} if not graph[target].pure else impure_before[target]
        keep -= set(graph.producers(prim.name))  # already ordered by data
        if keep != prim.after:
            new_after[prim.name] = frozenset(keep)
    if not new_after:
        return graph
    g = graph.copy()
    dropped = 0
    for name, after in new_after.items():
        dropped += len(g[name].after - after)
        g.set_after(name, after)
    ctx.note(f"{dropped} control dependencies were module order, not data flow")
    return g
