"""The latency bound of one query: its optimized graph's critical path, each primitive
costing what it took when run alone.

``IsolatingHandlers`` wraps every primitive handler of a runtime. Switched on (``measuring``),
it lets one primitive of a query run at a time and records how long each took, per graph
run; a dynamic expansion (a sub-graph built at run time, e.g. synthesis) is linked to the
node that returned it. The run becomes a :class:`~teola_plugin.sim.trace.QueryTrace` (what
``teola simulate`` replays), and :func:`trace_bound` computes, per graph run, the longest path
through its graph with those durations (an expanded node costs its own handler time plus
its sub-graph's critical path) and adds the query's time spent outside any graph (tracing,
framework code between graphs), which no scheduler can overlap. A graph run made within
another (a chain a LangGraph node calls, inside the graph's opaque step) is already part of
that run's isolated durations and is not counted again. Work an app runs in parallel outside
Teola's graphs (workflow steps, graph branches) is counted one after another, so for such
apps the bound can sit above the measured latency (the page then does not judge it). One
correction: vLLM runs a stream on while the isolated run times the query's other
primitives, so a decode's own wait can miss most of its tokens; a decode counts at least its
tokens at the step of the query's decodes that were timed whole.

With the runtime's cost model, :func:`trace_bound` also gives the *hardware-aware* bound:
engines of one compute group take turns on the same hardware, so a query cannot finish
before its busiest group has done its work, even with unlimited overlap. Each primitive's
isolated duration counts as that group's work, scaled down to the engine's best measured
batched throughput (a batch of 64 embeddings costs less per text than the one call of 8
this query made). LLM decode adds no group work: its profile is per sequence, and vLLM
runs concurrent sequences' decode steps together, so its share is unknown and left to
the paths (counted unscaled, the bound sat above what Teola achieved on
tree_summarize, whose parallel decodes batch).
A group's work also bounds a node's start: everything the group computes for the node's
ancestors must be done first, and after the last of it finishes the path from the ancestor
that did it to the node must still run: at least the least, over those ancestors, of their
longest path to the node (a tree_summarize root waits for
every leaf's prefill on the one LLM engine, then for one leaf's whole decode). A prefill's
work is at most its prompt at the engine's best profiled rate: timed alone, it also holds
the decodes vLLM runs on beside it.
The hardware-aware bound is the outside time plus the larger of that path and the busiest
group's work; it is never below the critical-path bound.

Nothing here changes what a query computes; switched off it only forwards calls.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ir.expansion import Expansion
from ..ir.ops import Op
from ..optimizer.cost import CostModel
from ..runtime.handlers import PrimitiveHandlers
from ..sim.durations import DECODE, decode_floor_s, recorded_decode_step
from ..sim.trace import GraphTrace, QueryTrace, recorded_query

PREFILLS = frozenset({Op.LLM_PREFILL.value, Op.LLM_PARTIAL_PREFILL.value})

if TYPE_CHECKING:
    from ..ir.node import Primitive


@dataclass
class RunRecord:
    """What one GraphRun did while measured."""

    graph: Any
    started: float
    ended: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)
    expansions: dict[str, Any] = field(default_factory=dict)  # node -> child graph
    tokens: dict[str, int] = field(default_factory=dict)  # decode -> tokens its request generated


class _TokenCounter:
    """A decode's node context that reads how many tokens its request generated: the
    engines' deltas carry the running count (a delta may hold several tokens)."""

    def __init__(self, ctx: Any, state: Any) -> None:
        self._ctx = ctx
        self.tokens = max((d.num_generated_tokens for d in getattr(state, "first", ())), default=0)

    def resume_stream(self, stream_id: str) -> Any:
        return self._counted(self._ctx.resume_stream(stream_id))

    async def _counted(self, deltas: Any) -> Any:
        async for delta in deltas:
            self.tokens = max(self.tokens, getattr(delta, "num_generated_tokens", 0) or 0)
            yield delta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


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
        counted = _TokenCounter(ctx, inputs.get("state")) if op == Op.LLM_DECODE.value else None
        async with lock:
            t0 = time.perf_counter()
            out = await original(self, prim, inputs, counted or ctx)
            t1 = time.perf_counter()
        rec.durations[prim.name] = rec.durations.get(prim.name, 0.0) + (t1 - t0)  # per item when pipelined
        if counted is not None:
            rec.tokens[prim.name] = rec.tokens.get(prim.name, 0) + counted.tokens
        rec.ended = max(rec.ended, t1)
        if isinstance(out, Expansion):
            rec.expansions[prim.name] = out.graph
        return out

    handler.__name__ = op
    return handler


for _op in Op:
    if hasattr(PrimitiveHandlers, _op.value):
        setattr(IsolatingHandlers, _op.value, _isolated(_op.value))


def batched_work_s(cost_model: CostModel, prim: Primitive, duration_s: float) -> float:
    """``duration_s`` of ``prim`` (measured alone) as the work its compute group must do
    at best: scaled by the best per-item latency of its engine's profile over the per-item
    latency of the call it made, never up. Decode adds none (see the module doc); an
    unprofiled op keeps its duration."""
    return _group_work_s(cost_model, prim.op.value, prim.engine, prim.kind, cost_model.call_items(prim), duration_s)


def _group_work_s(cost_model: CostModel, op: str, engine: str, kind: str, items: float, duration_s: float) -> float:
    if op == Op.LLM_DECODE.value:
        return 0.0
    best = cost_model.best_item_latency(engine, op, kind)
    if best is None:
        return duration_s
    items = max(1.0, items)
    now = cost_model.latency(engine, op, items, kind) / items
    if now <= 0.0:
        return duration_s
    work = duration_s * min(1.0, best / now)
    # a prefill timed alone also holds the decodes vLLM runs on beside it: its prompt at the best rate caps it
    return min(work, items * best) if op in PREFILLS else work


@dataclass
class GraphBound:
    """One graph run's bounds: its critical path, its path when each compute group also does
    its ancestors' work first (``shared_path_s``, with a cost model), each group's work."""

    path_s: float
    shared_path_s: float
    work: Counter[str]


def _graph_bound(graph: GraphTrace, cost_model: CostModel | None, decode_step_s: float | None) -> GraphBound:
    """The bounds of the graph's isolated durations: an expanded node costs its own time plus
    its sub-graph's path, and its sub-graph's work joins the graph's. A decode costs at least
    its tokens at ``decode_step_s``: vLLM runs a stream on while the isolated run times other
    primitives, so its own wait can be short. The shared path starts a node no earlier than
    each group's work on its ancestors plus the least, over them, of their longest path to it."""
    finish: dict[str, float] = {}  # critical path
    shared: dict[str, float] = {}  # shared path
    cost_of: dict[str, float] = {}  # each node's cost on the shared path
    work: dict[str, Counter[str]] = {}  # each node's (and its expansion's) work per group
    gaps: dict[str, dict[str, float]] = {}  # node -> its ancestors -> longest path from their end to its start
    for node in graph.nodes:  # topological order
        cost = max(node.measured_s or 0.0, decode_floor_s(node, decode_step_s) if node.op == DECODE else 0.0)
        shared_cost, mine = cost, Counter[str]()
        if node.expansion is not None:
            sub = _graph_bound(node.expansion, cost_model, decode_step_s)
            cost += sub.path_s
            shared_cost += sub.shared_path_s
            mine.update(sub.work)
        if cost_model is not None and node.measured_s is not None:
            mine[node.group] += _group_work_s(cost_model, node.op, node.engine, node.kind, node.items,
                                              node.measured_s)
        preds = [p for p in node.preds if p in finish]
        finish[node.name] = cost + max((finish[p] for p in preds), default=0.0)
        gap: dict[str, float] = {}
        for p in preds:
            gap.setdefault(p, 0.0)
            for u, t in gaps[p].items():
                gap[u] = max(gap.get(u, 0.0), t + cost_of[p])
        start = max((shared[p] for p in preds), default=0.0)
        for group in {g for u in gap for g, w in work[u].items() if w > 0}:
            # the last of the group's work on the ancestors ends no earlier than all of it would
            # back to back; then the path from whichever ancestor did it runs: the least of theirs
            done_first = [u for u in gap if work[u][group] > 0]
            start = max(start, sum(work[u][group] for u in done_first) + min(gap[u] for u in done_first))
        shared[node.name], cost_of[node.name] = start + shared_cost, shared_cost
        gaps[node.name], work[node.name] = gap, mine
    groups = sum(work.values(), Counter[str]())
    return GraphBound(max(finish.values(), default=0.0), max(shared.values(), default=0.0), groups)


def trace_bound(trace: QueryTrace, cost_model: CostModel | None = None) -> dict[str, Any]:
    """The bound of a recorded query: the sum of its top-level graph runs' critical paths
    plus its time outside them; with ``cost_model``, the hardware-aware bound beside it."""
    paths, shared_paths, groups = 0.0, 0.0, Counter[str]()
    step = recorded_decode_step([trace])  # this query's decodes that were timed whole
    for graph in trace.graphs:
        bound = _graph_bound(graph, cost_model, step)
        paths += bound.path_s
        shared_paths += bound.shared_path_s
        groups.update(bound.work)
    outside = trace.outside_s
    out: dict[str, Any] = {"bound_s": paths + outside, "critical_path_s": paths, "outside_graph_s": outside,
                           "isolated_wall_s": trace.meta.get("wall_s")}
    if cost_model is not None:
        busiest = max(groups.values(), default=0.0)
        out.update({"hw_bound_s": outside + max(paths, shared_paths, busiest),
                    "group_work_s": {g: round(w, 4) for g, w in sorted(groups.items())}})
    return out


def query_bound(handlers: IsolatingHandlers, wall_s: float,
                cost_model: CostModel | None = None) -> dict[str, Any]:
    """The bound of the one query measured since the last ``reset``, whose isolated run took
    ``wall_s`` (:func:`trace_bound` of its recorded trace)."""
    trace = recorded_query(handlers, wall_s, cost_model or CostModel.default())
    return trace_bound(trace, cost_model)
