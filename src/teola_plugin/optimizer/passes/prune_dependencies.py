"""Dependency pruning: keep only the waits that are real.

A tracer records the framework's module order as control dependencies (``after``), so
the query embedding waits for document ingestion although it never reads the index.
Data edges are real and stay (vector_search reads the INDEX handle that vector_insert
returns, so it still waits for the data). A control edge is kept only where order is
observable:

* between two impure primitives: side effects keep their order. An impure node's wait
  on a pure node stands for the impure nodes that one (transitively) waited on, so those
  are what it keeps;
* between two readers of the same mutable value (an INDEX handle, or an object of
  unknown type) when one of them is impure: a search of the index that came before an
  insert into it must not see the new rows (and one that came after must).

Purity is the contract: a pure primitive has no side effects and reads external state
only through its data inputs.
"""

from __future__ import annotations

from collections import defaultdict

from ...ir.analysis import upstream
from ...ir.graph import PGraph
from ...ir.ports import PortType
from ..context import PassContext

NAME = "prune_dependencies"
DESCRIPTION = "drop control dependencies that are not data dependencies (side effects keep their order)"
MUTABLE = frozenset({PortType.INDEX, PortType.VALUE, PortType.ANY})  # may name shared state


def _state_order(graph: PGraph) -> dict[str, set[str]]:
    """node -> earlier readers of a mutable value it shares, where one of the two is impure."""
    shared = {ref for p in graph.nodes if not p.pure for ref in p.inputs.values()
              if len(graph.uses(ref)) > 1 and graph.type_of(ref) in MUTABLE}
    order = {name: i for i, name in enumerate(graph.topological_order())} if shared else {}
    readers = {ref: sorted(dict.fromkeys(c for c, _ in graph.uses(ref)), key=order.__getitem__)
               for ref in shared}
    ancestors: dict[str, set[str]] = {}

    def ancestors_of(name: str) -> set[str]:
        if name not in ancestors:
            ancestors[name] = upstream(graph, graph.predecessors(name))
        return ancestors[name]

    keep: dict[str, set[str]] = defaultdict(set)
    for names in readers.values():
        if len(names) > 1 and not all(graph[n].pure for n in names):
            for i, later in enumerate(names):  # topological order
                for earlier in names[:i]:
                    if (not graph[earlier].pure or not graph[later].pure) and earlier in ancestors_of(later):
                        keep[later].add(earlier)
    return keep


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    state = _state_order(graph)
    # For each pure node, the nearest impure nodes it was ordered after (data or control).
    impure_before: dict[str, frozenset[str]] = {}
    new_after: dict[str, frozenset[str]] = {}
    for prim in graph.nodes:
        keep = set(state.get(prim.name, ()))
        if prim.pure:
            sets = [s for q in graph.predecessors(prim.name)
                    if (s := impure_before[q] if graph[q].pure else frozenset((q,)))]
            impure_before[prim.name] = (sets[0] if len(sets) == 1  # shared, not copied: the common case
                                        else frozenset().union(*sets))
        else:
            for target in prim.after:
                keep |= {target} if not graph[target].pure else impure_before[target]
        keep.difference_update(r.node for r in prim.inputs.values())  # already ordered by data
        if keep != prim.after:
            new_after[prim.name] = frozenset(keep)
    if not new_after:
        return graph
    g = graph.copy()
    dropped = added = 0
    for name, after in new_after.items():
        dropped += len(g[name].after - after)
        added += len(after - g[name].after)
        g.set_after(name, after)
    ctx.note(f"{dropped} control dependencies were module order, not data flow"
             + (f"; {added} added to keep side effects in order" if added else ""))
    return g
