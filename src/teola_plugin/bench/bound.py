"""The latency bound of one query: its optimized graph's critical path, each primitive
costing what it took when run alone.

``IsolatingHandlers`` wraps every primitive handler of a runtime. Switched on (``measuring``),
it lets one primitive of a query run at a time and records how long each took, per graph
run; a dynamic expansion (a sub-graph built at run time, e.g. synthesis) is linked to the
node that returned it. :func:`query_bound` then computes, per graph run, the longest path
through its graph with those durations (an expanded node costs its own handler time plus
its sub-graph's critical path) and adds the query's time spent outside any graph (tracing,
framework code between graphs), which no scheduler can overlap.

Nothing here changes what a query computes; switched off it only forwards calls.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..ir.analysis import critical_path
from ..ir.ops import Op
from ..ir.expansion import Expansion
from ..runtime.handlers import PrimitiveHandlers


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


def _graph_bound(rec: RunRecord, by_graph: dict[int, RunRecord]) -> tuple[float, float]:
    """(critical path, end time including expansions) of one run."""
    cost = dict(rec.durations)
    ended = rec.ended
    for node, child_graph in rec.expansions.items():
        child = by_graph.get(id(child_graph))
        if child is not None:
            child_path, child_end = _graph_bound(child, by_graph)
            cost[node] = cost.get(node, 0.0) + child_path
            ended = max(ended, child_end)
    length, _ = critical_path(rec.graph, lambda p: cost.get(p.name, 0.0))
    return length, ended


def query_bound(handlers: IsolatingHandlers, wall_s: float) -> dict[str, float]:
    """The bound of the one query measured since the last ``reset``, whose isolated run took
    ``wall_s``: sum over its top-level graph runs of their critical paths, plus the time the
    query spent outside them."""
    by_graph = {id(r.graph): r for r in handlers.runs.values()}
    children = {id(g) for r in handlers.runs.values() for g in r.expansions.values()}
    paths, inside = 0.0, 0.0
    for gid, rec in by_graph.items():
        if gid in children:
            continue
        length, ended = _graph_bound(rec, by_graph)
        paths += length
        inside += max(0.0, ended - rec.started)
    outside = max(0.0, wall_s - inside)
    return {"bound_s": paths + outside, "critical_path_s": paths, "outside_graph_s": outside,
            "isolated_wall_s": wall_s}
