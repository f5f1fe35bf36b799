"""Dead-code elimination: drop pure primitives no graph output needs.

Live = graph outputs, impure primitives (their side effects are the point), and
everything a live primitive reads or waits on. The rest is pure and unobservable.
"""

from __future__ import annotations

from ...ir.graph import PGraph
from ..context import PassContext

NAME = "eliminate_dead"
DESCRIPTION = "remove pure primitives whose results reach no graph output"


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    live: set[str] = set()
    stack = [r.node for r in graph.outputs.values() if r.node in graph]
    stack += [p.name for p in graph.nodes if not p.pure]
    while stack:
        name = stack.pop()
        if name not in live:
            live.add(name)
            stack.extend(graph.predecessors(name))
    order = graph.topological_order()
    dead = [n for n in order if n not in live]
    if not dead:
        return graph
    g = graph.copy()
    for name in reversed(dead):  # readers first, so nothing still reads a removed node
        g.remove(name)
    ctx.note(f"{len(dead)} primitive(s) computed values nobody uses")
    return g
