"""Structural analyses of a PGraph: levels, critical path, cycles, networkx export.

All of them follow data *and* control edges: a control dependency delays a node exactly
as a data dependency does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Union

from .node import Primitive

if TYPE_CHECKING:
    import networkx as nx

    from .graph import PGraph


class CostModelLike(Protocol):
    def node_cost(self, prim: Primitive) -> float: ...


CostFn = Union[CostModelLike, Callable[[Primitive], float]]


def as_cost_fn(cost_model: CostFn) -> Callable[[Primitive], float]:
    node_cost = getattr(cost_model, "node_cost", None)
    return node_cost if callable(node_cost) else cost_model  # type: ignore[return-value]


def depth(graph: PGraph) -> tuple[dict[str, int], int]:
    level: dict[str, int] = {}
    for name in graph.topological_order():
        level[name] = 1 + max((level[p] for p in graph.predecessors(name)), default=-1)
    return level, 1 + max(level.values(), default=-1)


def upstream(graph: PGraph, starts: Iterable[str]) -> set[str]:
    """``starts`` (those in the graph) and every node they depend on, directly or not."""
    seen: set[str] = set()
    stack = [n for n in starts if n in graph]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(graph.predecessors(name))
    return seen


def finish_times(graph: PGraph, cost_model: CostFn) -> tuple[dict[str, float], dict[str, str | None]]:
    """Earliest finish of every node with unlimited engines, and the predecessor that set it."""
    cost = as_cost_fn(cost_model)
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    prims, preds, get = graph._prims, graph.predecessors, finish.__getitem__
    for name in graph.topological_order():
        ps = preds(name)
        best = max(ps, key=get) if ps else None  # the first of equal maxima: deterministic
        finish[name] = (finish[best] if best is not None else 0.0) + cost(prims[name])
        via[name] = best
    return finish, via


def critical_path(graph: PGraph, cost_model: CostFn) -> tuple[float, list[str]]:
    finish, via = finish_times(graph, cost_model)
    if not finish:
        return 0.0, []
    end = max(finish, key=lambda n: finish[n])  # first maximum in dict (topological) order
    path = [end]
    while (prev := via[path[-1]]) is not None:
        path.append(prev)
    return finish[end], path[::-1]


def find_cycle(graph: PGraph, stuck: list[str]) -> list[str]:
    """A cycle among ``stuck`` (nodes a topological sort could not emit), in edge order.

    Every stuck node has a stuck predecessor, so walking predecessors must revisit a node.
    """
    stuck_set = set(stuck)
    seen: dict[str, int] = {}
    walk: list[str] = []
    node = stuck[0]
    while node not in seen:
        seen[node] = len(walk)
        walk.append(node)
        node = next(p for p in graph.predecessors(node) if p in stuck_set)
    return walk[seen[node]:][::-1]


def to_networkx(graph: PGraph) -> nx.MultiDiGraph:
    """Primitives as nodes (with op, engine, origin, attrs); one edge per data binding
    (key = consumer port) or control dependency (key = "after")."""
    import networkx as nx

    g = nx.MultiDiGraph(name=graph.name)
    for p in graph.nodes:
        g.add_node(p.name, op=p.op.value, engine=p.engine, origin=p.origin, attrs=dict(p.attrs))
    for p in graph.nodes:
        for port, ref in p.inputs.items():
            if ref.node in graph:
                g.add_edge(ref.node, p.name, key=port, kind="data", src_port=ref.port)
        for a in sorted(p.after):
            if a in graph:
                g.add_edge(a, p.name, key="after", kind="control")
    return g
