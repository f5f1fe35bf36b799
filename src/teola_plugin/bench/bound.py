"""The latency bound of one query: its optimized graph's critical path, each primitive
costing what it took when run alone.

``IsolatingHandlers`` wraps every primitive handler of a runtime. Switched on (``measuring``),
it lets one primitive of a query run at a time and records how long each took, per graph
run; a dynamic expansion (a sub-graph built at run time, e.g. synthesis) is linked to the
node that returned it. :func:`query_bound` then computes, per graph run, the longest path
through its graph with those durations (an expanded node costs its own handler time plus
its sub-graph's critical path) and adds the query's time spent outside any graph (tracing,
framework code between graphs), which no scheduler can overlap.

With the runtime's cost model, :func:`query_bound` also gives the *hardware-aware* bound:
engines of one compute group take turns on the same hardware, so a query cannot finish
before its busiest group has done its work, even with unlimited overlap. Each primitive's
isolated duration counts as that group's work, scaled down to the engine's best measured
batched throughput (a batch of 64 embeddings costs less per text than the one call of 8
this query made). LLM decode adds no group work: its profile is per sequence, and vLLM
runs concurrent sequences' decode steps together, so its share is unknown and left to
the critical path (counted unscaled, the bound sat above what Teola achieved on
tree_summarize, whose parallel decodes batch).
The hardware-aware bound is the outside time plus the larger of the critical path and the
busiest group's work; it is never below the critical-path bound.

Nothing here changes what a query computes; switched off it only forwards calls.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ir.analysis import critical_path
from ..ir.ops import Op
from ..ir.expansion import Expansion
from ..runtime.handlers import PrimitiveHandlers

if TYPE_CHECKING:
    from ..ir.node import Primitive
    from ..optimizer.cost import CostModel


@dataclass
class RunRecord:
    """What one GraphRun did while measured."""

    graph: Any
    started: float
    ended: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)
    expansions: dict[str, Any] = field(default_factory=dict)  # node -> child graph


class IsolatingHandlers(PrimitiveHandlers):
    """Primitive handlers that, while ``measuring``, run one primitive per query at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.measuring = False
        self.runs: dict[int, RunRecord] = {}  # id(graph) -> record
        self._locks: dict[str, asyncio.Lock] = {}

    def reset(self) -> None:
        self.runs.clear()
        self._locks.clear()


def _isolated(op: str) -> Any:
    original = getattr(PrimitiveHandlers, op)

    async def handler(self: IsolatingHandlers, prim: Any, inputs: Any, ctx: Any) -> Any:
        if not self.measuring:
            return await original(self, prim, inputs, ctx)
        run = ctx.run
        lock = self._locks.setdefault(run.query_id, asyncio.Lock())  # child expansions share the query id
        rec = self.runs.setdefault(id(run.graph), RunRecord(run.graph, time.perf_counter()))
        async with lock:
            t0 = time.perf_counter()
            out = await original(self, prim, inputs, ctx)
            t1 = time.perf_counter()
        rec.durations[prim.name] = rec.durations.get(prim.name, 0.0) + (t1 - t0)  # per item when pipelined
        rec.ended = max(rec.ended, t1)
        if isinstance(out, Expansion):
            rec.expansions[prim.name] = out.graph
        return out

    handler.__name__ = op
    return handler


for _op in Op:
    if hasattr(PrimitiveHandlers, _op.value):
        setattr(IsolatingHandlers, _op.value, _isolated(_op.value))


@dataclass
class GraphBound:
    """One measured graph run, expansions included."""

    critical_path_s: float
    ended: float
    group_work_s: dict[str, float]  # compute group -> work at the engines' best throughput


def batched_work_s(cost_model: CostModel, prim: Primitive, duration_s: float) -> float:
    """``duration_s`` of ``prim`` (measured alone) as the work its compute group must do
    at best: scaled by the best per-item latency of its engine's profile over the per-item
    latency of the call it made, never up. Decode adds none (see the module doc); an
    unprofiled op keeps its duration."""
    if prim.op is Op.LLM_DECODE:
        return 0.0
    best = cost_model.best_item_latency(prim.engine, prim.op, prim.kind)
    if best is None:
        return duration_s
    items = max(1.0, cost_model.call_items(prim))
    now = cost_model.latency(prim.engine, prim.op, items, prim.kind) / items
    if now <= 0.0:
        return duration_s
    return duration_s * min(1.0, best / now)


def _graph_bound(rec: RunRecord, by_graph: dict[int, RunRecord], cost_model: CostModel | None) -> GraphBound:
    cost = dict(rec.durations)
    ended = rec.ended
    groups: Counter[str] = Counter()  # update() adds: a child's work joins its parent's
    for node, child_graph in rec.expansions.items():
        child = by_graph.get(id(child_graph))
        if child is not None:
            sub = _graph_bound(child, by_graph, cost_model)
            cost[node] = cost.get(node, 0.0) + sub.critical_path_s
            ended = max(ended, sub.ended)
            groups.update(sub.group_work_s)
    if cost_model is not None:
        for name, duration in rec.durations.items():
            if name in rec.graph:
                prim = rec.graph[name]
                group = cost_model.compute_group(prim.engine, prim.kind)
                groups[group] += batched_work_s(cost_model, prim, duration)
    length, _ = critical_path(rec.graph, lambda p: cost.get(p.name, 0.0))
    return GraphBound(length, ended, dict(groups))


def query_bound(handlers: IsolatingHandlers, wall_s: float,
                cost_model: CostModel | None = None) -> dict[str, Any]:
    """The bound of the one query measured since the last ``reset``, whose isolated run took
    ``wall_s``: sum over its top-level graph runs of their critical paths, plus the time the
    query spent outside them; with ``cost_model``, the hardware-aware bound beside it."""
    by_graph = {id(r.graph): r for r in handlers.runs.values()}
    children = {id(g) for r in handlers.runs.values() for g in r.expansions.values()}
    paths, inside = 0.0, 0.0
    groups: Counter[str] = Counter()
    for gid, rec in by_graph.items():
        if gid in children:
            continue
        bound = _graph_bound(rec, by_graph, cost_model)
        paths += bound.critical_path_s
        inside += max(0.0, bound.ended - rec.started)
        groups.update(bound.group_work_s)
    outside = max(0.0, wall_s - inside)
    out: dict[str, Any] = {"bound_s": paths + outside, "critical_path_s": paths, "outside_graph_s": outside,
                           "isolated_wall_s": wall_s}
    if cost_model is not None:
        busiest = max(groups.values(), default=0.0)
        out.update({"hw_bound_s": outside + max(paths, busiest),
                    "group_work_s": {g: round(w, 4) for g, w in sorted(groups.items())}})
    return out
