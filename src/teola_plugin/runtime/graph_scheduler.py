"""The upper scheduling layer: one :class:`GraphRun` per query.

Every value of the graph is a future. Each primitive is a task that awaits its inputs and
control dependencies, then runs its handler: so a primitive is dispatched the moment its
last input resolves (event driven, no polling loop), and the engine schedulers underneath
order and batch what many queries dispatched at once.

Streams. A decode marked ``stream_items`` emits each item (a completed line) as soon as
it is decoded; the primitives marked ``stream_from`` that decode (its *pipelined region*,
e.g. embed -> vector_search) run once per item right then, and each region output that
leaves the region resolves to the per-item results concatenated in item order — what the
un-pipelined region would have returned, by the splitting law of ``ir.ops``.

Errors, cancellation, timeout. The first failing primitive fails the query: its
exception (same type, with a note naming the primitive and the framework component it was
traced from) reaches the caller, and every other outstanding primitive of that query is
cancelled (an LLM stream being cancelled aborts its vLLM request). ``timeout_s`` bounds the
whole query the same way, raising :class:`~teola_plugin.errors.QueryTimeoutError`.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..errors import ConfigError, QueryTimeoutError
from ..ir.graph import PGraph
from ..ir.node import INPUT, Primitive, Ref
from ..ir.semantics import shard_slice
from ..ir.expansion import Expansion
from .handlers import PrimitiveHandlers
from .hosting import ReplicaPool
from .policies import Priority
from .requests import BatchInfo, StreamOpen
from .run_observer import RunObserver
from .timeline import Span, Timeline
from .values import LLMState

CostFn = Callable[[Primitive], float]


def check_timeout(timeout_s: Any, name: str = "timeout_s") -> float | None:
    """A duration: a positive, finite number of seconds, or None for none."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds or None, got {timeout_s!r}")
    return float(timeout_s)


def remaining_path(graph: PGraph, cost: CostFn) -> dict[str, float]:
    """Cost of the longest path from each node to the end of the graph, the node included."""
    remaining: dict[str, float] = {}
    for name in reversed(graph.topological_order()):
        after = [remaining[s] for s in graph.successors(name)]
        remaining[name] = cost(graph[name]) + max(after, default=0.0)
    return remaining


class NodeContext:
    """What a handler may do: submit to engines (with this node's priority), stream, emit."""

    def __init__(self, run: GraphRun, prim: Primitive) -> None:
        self.run = run
        self.prim = prim
        self.priority = Priority(run.remaining.get(prim.name, 0.0), run.arrival, run.query_id, run.critical_path_s)
        self.batch: BatchInfo | None = None

    def engine(self) -> ReplicaPool:
        return self.run.engines(self.prim.engine)

    async def submit(self, op: str, payload: Mapping[str, Any], route_key: str | None = None) -> Any:
        result, info = await self.engine().submit(op, payload, self.priority, route_key=route_key)
        self.record_batch(info)
        return result

    async def open_stream(self, method: str, kwargs: Mapping[str, Any]) -> StreamOpen:
        return await self.engine().open_stream(method, kwargs, self.priority)

    def resume_stream(self, sid: str):
        return self.engine().resume_stream(sid)

    def record_batch(self, info: BatchInfo) -> None:
        self.batch = info

    def emit_item(self, item: Any) -> None:
        self.run.on_item(self.prim, item)

    def streams_to_caller(self) -> bool:
        """The caller streams the tokens of a node reading this one (an LLM call it streams),
        or every LLM call's (a framework's streaming callbacks: LangChain's astream_events)."""
        run = self.run
        return run.stream_llm_calls or (run.on_token is not None
                                        and any(c in run.token_nodes for c in run.graph.consumers(self.prim.name)))

    def emit_token(self, text: str) -> None:
        if self.run.on_token is not None and self.prim.name in self.run.token_nodes:
            self.run.on_token(text)


class GraphRun:
    """Executes one query's graph on the runtime's engines."""

    def __init__(
        self,
        graph: PGraph,
        inputs: Mapping[str, Any],
        engines: Callable[[str], ReplicaPool],
        *,
        cost: CostFn,
        timeline: Timeline | None = None,
        handlers: PrimitiveHandlers | None = None,
        query_id: str | None = None,
        timeout_s: float | None = None,
        on_token: Callable[[str], None] | None = None,
        token_nodes: frozenset[str] = frozenset(),
        on_output: Callable[[str, Any], None] | None = None,
        stream_llm_calls: bool = False,
        arrival: float | None = None,
        after_s: float = 0.0,
        critical_path_s: float | None = None,
        slack_s: float = 0.0,
        start_engines: Callable[..., Awaitable[Any]] | None = None,
        observer: RunObserver | None = None,
    ) -> None:
        missing = set(graph.inputs) - set(inputs)
        if missing:
            raise TypeError(f"graph {graph.name!r} needs inputs {sorted(missing)}; got {sorted(inputs)}")
        self.graph = graph
        self.inputs = dict(inputs)
        self.engines = engines
        self.start_engines = start_engines  # for engines first named by a graph expanded at run time
        self.cost = cost
        self.timeline = timeline
        self.handlers = handlers or PrimitiveHandlers()
        self.query_id = query_id or uuid.uuid4().hex[:12]
        self.timeout_s = check_timeout(timeout_s)
        self.on_token = on_token
        self.token_nodes = token_nodes
        self.on_output = on_output  # called with (output name, value) as each graph output is ready
        self.stream_llm_calls = stream_llm_calls  # send LLM calls as streaming requests (someone hears tokens)
        self.arrival = arrival if arrival is not None else time.time()
        # the query's work after this graph (an app run's steps left: runtime/app_runs.py) counts
        # on every node's path
        self.after_s = after_s
        self.remaining = {name: s + after_s for name, s in remaining_path(graph, cost).items()}
        # the query's critical path when it started (a graph expanded at run time keeps its
        # query's), plus the slack of a run's step off its answer's path: the engine
        # schedulers order by each node's latest start by it (runtime/policies.py)
        self.critical_path_s = (critical_path_s if critical_path_s is not None
                                else max(self.remaining.values(), default=after_s) + slack_s)
        self.observer = observer  # watches node by node (a framework's own run reports)
        self._values: dict[Ref, asyncio.Future[Any]] = {}
        self._done: dict[str, asyncio.Future[None]] = {}
        self._regions: dict[str, list[str]] = {}  # decode -> its pipelined nodes, in order
        self._item_tasks: dict[str, list[asyncio.Task[dict[Ref, Any]]]] = {}
        self._states: list[LLMState] = []
        self._tasks: list[asyncio.Task[None]] = []

    # -- entry ---------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        if self.observer is None:
            return await self._run_bounded()
        self.observer.start(self.inputs)
        try:
            outputs = await self._run_bounded()
        except BaseException as exc:
            await self.observer.finish(exc)
            raise
        await self.observer.finish(None)
        return outputs

    async def _run_bounded(self) -> dict[str, Any]:
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                return await self._run()
        except TimeoutError:
            if not deadline.expired():  # an engine's own timeout: not ours to rename
                raise
            pending = [t.get_name() for t in self._tasks if not t.done()]
            raise QueryTimeoutError(
                f"query {self.query_id} did not finish within {self.timeout_s} s; "
                f"still running: {', '.join(pending) or 'nothing (finishing)'}"
            ) from None
        finally:
            await self._cleanup()

    async def _run(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for name, value in self.inputs.items():
            fut = loop.create_future()
            fut.set_result(value)
            self._values[Ref(INPUT, name)] = fut
        for prim in self.graph.nodes:
            for port in prim.outputs:
                self._values[Ref(prim.name, port)] = loop.create_future()
            self._done[prim.name] = loop.create_future()
            source = prim.attrs.get("stream_from")
            if source:
                self._regions.setdefault(source, []).append(prim.name)
        for prim in self.graph.nodes:
            if prim.attrs.get("stream_from"):
                continue  # runs per item, started by its decode
            self._tasks.append(loop.create_task(self._run_node(prim), name=prim.name))
        outputs = {name: self._values[ref] for name, ref in self.graph.outputs.items()}
        if self.on_output is not None:
            for name, fut in outputs.items():
                fut.add_done_callback(functools.partial(self._report_output, name))
        waiting = set(self._tasks) | set(outputs.values())
        while True:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_EXCEPTION)
            for fut in done:
                if not fut.cancelled() and fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
            waiting -= done
            if all(f.done() for f in outputs.values()):
                return {name: f.result() for name, f in outputs.items()}
            if not waiting:  # cannot happen for a valid graph
                raise RuntimeError(f"graph {self.graph.name!r} finished without producing {sorted(outputs)}")

    def _report_output(self, name: str, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.on_output(name, fut.result())  # type: ignore[misc]

    async def _cleanup(self) -> None:
        tasks = self._tasks + [t for ts in self._item_tasks.values() for t in ts]
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for state in self._states:  # a prefill whose decode never ran keeps a stream open
            if not state.consumed and not state.finished:
                state.consumed = True
                await self.engines(state.engine).close_stream(state.stream_id)
        for fut in self._values.values():  # nobody will read these; silence "never retrieved"
            if fut.done() and not fut.cancelled():
                fut.exception()

    # -- one primitive -------------------------------------------------------------------
    async def _gather_inputs(self, prim: Primitive, local: Mapping[Ref, Any] | None = None) -> dict[str, Any]:
        deps = [self._done[a] for a in prim.after if a in self._done]
        if deps:
            await asyncio.gather(*deps)
        values = {}
        for port, ref in prim.inputs.items():
            values[port] = local[ref] if local is not None and ref in local else await self._values[ref]
        shard = prim.shard
        if shard is not None:  # the head of a shard chain slices; later links are pre-sliced
            for port in prim.attrs.get("sliced", prim.spec.split_inputs):
                if port in values:
                    values[port] = shard_slice(values[port], *shard)
        return values

    async def _call(self, prim: Primitive, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run the handler, record the span, annotate errors with the primitive."""
        ctx = NodeContext(self, prim)
        ready = time.time()
        status = "ok"
        try:
            outputs = await getattr(self.handlers, prim.op.value)(prim, inputs, ctx)
            if isinstance(outputs, Expansion):
                outputs = await self._expand(prim, outputs)
            return outputs
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as exc:
            status = "error"
            exc.add_note(f"While executing {prim.describe()} in query {self.query_id}")
            raise
        finally:
            if self.timeline is not None:
                end = time.time()
                info = ctx.batch
                start = info.start if info is not None and info.start >= ready else ready
                self.timeline.record(Span(
                    self.query_id, prim.name, prim.op.value, prim.engine, ready, start,
                    info.end if info is not None and info.end >= start and prim.op.value != "llm_decode" else end,
                    info.batch_id if info else -1, info.size if info else 1, status, prim.origin))

    async def _run_node(self, prim: Primitive) -> None:
        try:
            inputs = await self._gather_inputs(prim)
            if self.observer is not None:
                await self.observer.entering(prim)
            outputs = await self._call(prim, inputs)
            for port in prim.outputs:
                self._values[Ref(prim.name, port)].set_result(outputs.get(port))
            for value in outputs.values():
                if isinstance(value, LLMState):
                    self._states.append(value)
            if prim.name in self._regions:
                await self._finish_region(prim)
            if self.observer is not None:
                self.observer.produced(prim, outputs)
            self._done[prim.name].set_result(None)
        except BaseException as exc:
            for port in prim.outputs:
                fut = self._values[Ref(prim.name, port)]
                if not fut.done():
                    fut.cancel() if isinstance(exc, asyncio.CancelledError) else fut.set_exception(exc)
            if not self._done[prim.name].done():
                self._done[prim.name].cancel()
            raise

    def _after(self, name: str) -> float:
        """The work left after node ``name``: its successors' longest remaining path (the
        query's work after this graph when it has none)."""
        return max((self.remaining[s] for s in self.graph.successors(name)), default=self.after_s)

    async def _expand(self, prim: Primitive, expansion: Expansion) -> dict[str, Any]:
        # If this node's text is what the caller streams, so is the text of the sub-graph
        # nodes that produce its outputs (e.g. the last refine step).
        streamed = prim.name in self.token_nodes
        needed = {p.engine for p in expansion.graph.nodes if p.kind != "cpu"}
        if needed and self.start_engines is not None:  # a no-op for started ones
            await self.start_engines(*sorted(needed))
        child = GraphRun(
            expansion.graph, expansion.inputs, self.engines, cost=self.cost, timeline=self.timeline,
            start_engines=self.start_engines,
            handlers=self.handlers, query_id=self.query_id, arrival=self.arrival,
            after_s=self._after(prim.name), critical_path_s=self.critical_path_s,
            on_token=self.on_token,
            stream_llm_calls=self.stream_llm_calls, observer=expansion.observer,
            token_nodes=(expansion.token_nodes if expansion.token_nodes is not None
                         else frozenset(r.node for r in expansion.graph.outputs.values())) if streamed else frozenset(),
        )
        if expansion.recover is None:
            return await child.run()
        caught, outputs = expansion.recover
        try:
            return await child.run()
        except caught as exc:
            return dict(outputs(exc))

    # -- pipelined regions (decode pipelining) -----------------------------------------------
    def on_item(self, decode: Primitive, item: Any) -> None:
        region = self._regions.get(decode.name)
        if not region:
            return
        task = asyncio.get_running_loop().create_task(
            self._run_item(decode, region, item), name=f"{region[0]}[{len(self._item_tasks.get(decode.name, []))}]")
        self._item_tasks.setdefault(decode.name, []).append(task)

    async def _run_item(self, decode: Primitive, region: list[str], item: Any) -> dict[Ref, Any]:
        """Run the region on one item: the decode's ``items`` port is [item] here."""
        local: dict[Ref, Any] = {Ref(decode.name, "items"): [item]}
        for name in region:
            prim = self.graph[name]
            inputs = await self._gather_inputs(prim, local)
            if self.observer is not None:
                await self.observer.entering(prim)
            outputs = await self._call(prim, inputs)
            for port in prim.outputs:
                local[Ref(name, port)] = outputs.get(port)
        return local

    async def _finish_region(self, decode: Primitive) -> None:
        """After the decode: resolve each region output to the per-item results in order."""
        region = self._regions[decode.name]
        results = await asyncio.gather(*self._item_tasks.get(decode.name, []))
        for name in region:
            prim = self.graph[name]
            gathered = {}
            for port in prim.outputs:
                ref = Ref(name, port)
                # An opaque region node (a lowered `.map()`) lists its per-item ports in attrs.
                if port in prim.spec.split_outputs or port in prim.attrs.get("item_outputs", ()):
                    value: Any = [x for local in results for x in (local[ref] or [])]
                else:  # shard-invariant outputs (handles) are the same from every item
                    value = results[0][ref] if results else None
                self._values[ref].set_result(value)
                gathered[port] = value
            if self.observer is not None:
                self.observer.produced(prim, gathered)
            self._done[name].set_result(None)
