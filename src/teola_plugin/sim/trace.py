"""What the simulator replays: one query's graphs with each primitive's work.

A :class:`QueryTrace` is the query's top-level graph runs (in the order the query made
them) and the time it spent outside them (tracing, framework code between graphs), which
no scheduler overlaps. Each :class:`NodeTrace` carries what the cost model needs (op,
engine, kind, compute group, work items) and, when recorded from a run, how long the
primitive took alone; a node that expanded at run time carries the graph it expanded into.
Traces are plain data (JSON), so a recorded benchmark can be simulated later, elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from ..bench.bound import IsolatingHandlers, RunRecord
    from ..ir.graph import PGraph
    from ..optimizer.cost import CostModel


@dataclass(frozen=True)
class NodeTrace:
    name: str
    op: str
    engine: str
    kind: str  # the engine kind a profile falls back to
    group: str  # the compute group it runs on (cost model)
    preds: tuple[str, ...]  # nodes it waits for (data and control)
    items: float  # work items of its engine call (cost model)
    measured_s: float | None = None  # alone, as the bound run measured it (None: never ran)
    expansion: GraphTrace | None = None  # the graph it returned at run time
    tokens: int | None = None  # a decode's generated tokens, as recorded (None: not known)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "op": self.op, "engine": self.engine, "kind": self.kind,
                               "group": self.group, "preds": list(self.preds), "items": self.items,
                               "measured_s": self.measured_s}
        if self.expansion is not None:
            out["expansion"] = self.expansion.to_dict()
        if self.tokens is not None:
            out["tokens"] = self.tokens
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeTrace:
        exp = d.get("expansion")
        return cls(d["name"], d["op"], d["engine"], d["kind"], d["group"], tuple(d["preds"]), float(d["items"]),
                   None if d.get("measured_s") is None else float(d["measured_s"]),
                   GraphTrace.from_dict(exp) if exp else None, d.get("tokens"))


@dataclass(frozen=True)
class GraphTrace:
    name: str
    nodes: tuple[NodeTrace, ...]  # topological order

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GraphTrace:
        return cls(d["name"], tuple(NodeTrace.from_dict(n) for n in d["nodes"]))

    def regrouped(self, groups: Mapping[str, str]) -> GraphTrace:
        """The same graph with engines moved to other hardware: ``groups`` maps an engine
        name or kind to its compute group (others keep theirs)."""
        return replace(self, nodes=tuple(
            replace(n, group=groups.get(n.engine) or groups.get(n.kind) or n.group,
                    expansion=n.expansion.regrouped(groups) if n.expansion is not None else None)
            for n in self.nodes))

    def all_nodes(self) -> list[NodeTrace]:
        """Its nodes and, depth first, those of the graphs they expanded into."""
        out: list[NodeTrace] = []
        for n in self.nodes:
            out.append(n)
            if n.expansion is not None:
                out.extend(n.expansion.all_nodes())
        return out


@dataclass(frozen=True)
class QueryTrace:
    app: str
    query: str
    graphs: tuple[GraphTrace, ...]  # top-level graph runs, one after another
    outside_s: float = 0.0  # time outside any graph run
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "query": self.query, "outside_s": self.outside_s,
                "graphs": [g.to_dict() for g in self.graphs], **({"meta": dict(self.meta)} if self.meta else {})}

    def regrouped(self, groups: Mapping[str, str]) -> QueryTrace:
        return replace(self, graphs=tuple(g.regrouped(groups) for g in self.graphs))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QueryTrace:
        return cls(d["app"], d["query"], tuple(GraphTrace.from_dict(g) for g in d["graphs"]),
                   float(d.get("outside_s", 0.0)), dict(d.get("meta", {})))


def graph_trace(graph: PGraph, cost_model: CostModel, measured: Mapping[str, float] | None = None,
                expansions: Mapping[str, GraphTrace] | None = None,
                tokens: Mapping[str, int] | None = None) -> GraphTrace:
    """``graph`` as a trace: work items and groups from ``cost_model``; ``measured``: the
    nodes' isolated durations; ``expansions``: node -> the graph it expanded into;
    ``tokens``: decode -> tokens generated."""
    measured, expansions, tokens = measured or {}, expansions or {}, tokens or {}
    nodes = []
    for name in graph.topological_order():
        prim = graph[name]
        nodes.append(NodeTrace(name, prim.op.value, prim.engine, prim.kind,
                               cost_model.compute_group(prim.engine, prim.kind), tuple(graph.predecessors(name)),
                               float(cost_model.call_items(prim)), measured.get(name), expansions.get(name),
                               tokens.get(name)))
    return GraphTrace(graph.name, tuple(nodes))


def _recorded_graph(rec: RunRecord, by_graph: Mapping[int, RunRecord], cost_model: CostModel) -> GraphTrace:
    expansions = {}
    for node, child_graph in rec.expansions.items():
        child = by_graph.get(id(child_graph))
        expansions[node] = (_recorded_graph(child, by_graph, cost_model) if child is not None
                            else graph_trace(child_graph, cost_model))
    return graph_trace(rec.graph, cost_model, rec.durations, expansions, rec.tokens)


def recorded_query(handlers: IsolatingHandlers, wall_s: float, cost_model: CostModel, app: str = "",
                   query: str = "") -> QueryTrace:
    """The query measured since the handlers' last ``reset`` (the benchmark's bound run: one
    primitive at a time), whose isolated run took ``wall_s``; ``meta["wall_s"]`` keeps it."""
    runs = sorted(handlers.runs.values(), key=lambda r: r.started)
    by_graph = {id(r.graph): r for r in runs}
    children = {id(g) for r in runs for g in r.expansions.values()}
    tops = [r for r in runs if id(r.graph) not in children]
    # A graph run that ran within another (a chain a LangGraph node called, inside the graph's
    # opaque step) is already part of that run's isolated durations: counted again, its work
    # would count twice. Concurrent sibling runs (parallel workflow steps) contained in one
    # another are dropped alike: they could have run side by side.
    span = {id(r): (r.started, _ended(r, by_graph)) for r in tops}
    tops = [r for i, r in enumerate(tops) if not any(
        _within(span[id(r)], span[id(o)]) and (span[id(o)] != span[id(r)] or j < i)
        for j, o in enumerate(tops) if o is not r)]
    inside = sum(max(0.0, span[id(r)][1] - span[id(r)][0]) for r in tops)
    return QueryTrace(app, query, tuple(_recorded_graph(r, by_graph, cost_model) for r in tops),
                      max(0.0, wall_s - inside), {"wall_s": wall_s})


def _within(inner: tuple[float, float], outer: tuple[float, float]) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def _ended(rec: RunRecord, by_graph: Mapping[int, RunRecord]) -> float:
    ended = rec.ended
    for child_graph in rec.expansions.values():
        child = by_graph.get(id(child_graph))
        if child is not None:
            ended = max(ended, _ended(child, by_graph))
    return ended
