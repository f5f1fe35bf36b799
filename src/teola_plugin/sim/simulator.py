"""Discrete-event simulation of the two-layer scheduler over recorded query traces.

What is modelled, and how the runtime does it:

* **Graph scheduler** (one per query): a primitive is dispatched when every node it waits
  for is done; with ``overlap`` (Teola) all ready primitives at once, without it (a
  framework's own sequential code) one at a time in the trace's order. A node that
  expanded at run time first does its own work, then runs the graph it expanded into, and
  is done when that graph is. Then the next top-level graph of the query runs.
* **Engine schedulers** (one per engine): requests queue by the runtime's priority rule
  (``BatchPolicy.key``: each request's latest start, by its query's arrival and
  critical path and its own remaining path) and
  leave as batches cut by the engine's ``BatchPolicy`` (same op, request and item caps,
  ``max_concurrent`` batches at once). Without ``batching`` every request is its own call
  and calls run side by side (threads calling an in-process model).
* **The LLM engine** batches continuously, as vLLM does: prefills leave in batches, and
  the sequences being decoded share decode steps (``n`` in flight each slowed by
  ``Durations.decode_slowdown(n)``). A prefill goes into the engine's next step, so the
  decodes wait while it computes (the step takes what the profile measured a prefill
  stalling a decode beside it), rather than sharing the hardware with it; the rest of a
  prefill's recorded time (its way into the engine and back) delays only its own requests.
* **Shared hardware**: everything running on one compute group (engine batches, the LLM's
  prefill and its decode steps, framework steps) shares it equally (processor sharing):
  ``k`` activities on a group each progress at ``1/k`` of their speed alone, on a CPU group
  at ``cpu_sharing / k`` when ``k >= 2`` (``Durations.cpu_sharing``, measured: thread pools
  sharing cores lose some of their work to each other). Engines of different groups run
  side by side. This is why a 2-core CPU gains less from overlap than the critical path
  promises.
* **Arrivals**: ``closed`` (each query starts when the previous one ends: the benchmark's
  per-question runs) or a list of arrival times (the Poisson sweeps).

Not modelled: per-call runtime overhead (a Ray round trip is ~1 ms), the prefix cache,
decode pipelining of streamed items (a streamed consumer waits for the whole decode).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..runtime.policies import BatchPolicy, Priority, default_policy
from .durations import DECODE, Durations
from .trace import GraphTrace, NodeTrace, QueryTrace

EPS = 1e-9
LLM_KIND = "llm"
CPU_KIND = "cpu"
CPU_GROUP = "cpu:"  # the runtime's name prefix for time-shared CPU cores (runtime/compute_groups.py)


@dataclass(frozen=True)
class SystemModel:
    """How a system runs an app: ``overlap`` a query's independent primitives (the graph
    scheduler), ``batching`` across requests (the engine schedulers, by their policies)."""

    name: str
    overlap: bool
    batching: bool
    priority: str = "topology"
    max_queries: int | None = None  # queries in flight at once; later arrivals wait their turn (None: all)


# The benchmark's same-engine systems: plain runs the framework's own code on the plugin's
# model classes, whose requests reach the same engine schedulers (batched, first come first
# served: plain code sends no priority).
SYSTEMS = {
    # the framework's own code, one step after another
    "plain-sequential": SystemModel("plain-sequential", overlap=False, batching=True, priority="fifo"),
    # the framework's async path (use_async, ainvoke): a query's independent calls at once
    "plain-concurrent": SystemModel("plain-concurrent", overlap=True, batching=True, priority="fifo"),
    "teola-full": SystemModel("teola-full", overlap=True, batching=True),
}


@dataclass
class QueryResult:
    query: str
    arrival_s: float
    finish_s: float

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.arrival_s


# -- work on shared hardware ---------------------------------------------------------------------
class Activity:
    """Work in progress on a compute group, measured in seconds alone."""

    waiting = False  # paused: takes no share of its group's hardware

    def __init__(self, work_s: float, on_done: Callable[[], None]) -> None:
        self.remaining = max(0.0, work_s)
        self.on_done = on_done

    def advance(self, alone_s: float) -> None:
        self.remaining -= alone_s

    def left(self) -> float:
        """Seconds alone until this activity next needs attention."""
        return self.remaining

    def settle(self) -> bool:
        """Called when ``left()`` reached zero; True when the activity is over."""
        self.on_done()
        return True


class DecodeLoop(Activity):
    """An LLM engine's decoding sequences, stepping together (continuous batching): each
    sequence's work is its time alone; ``n`` in flight each progress ``slowdown(n)`` times
    slower than alone."""

    def __init__(self, slowdown: Callable[[int], float]) -> None:
        super().__init__(0.0, lambda: None)
        self.slowdown = slowdown
        self.seqs: dict[int, list] = {}  # id -> [remaining seconds alone, on_done]
        self._ids = itertools.count()

    def add(self, alone_s: float, on_done: Callable[[], None]) -> None:
        self.seqs[next(self._ids)] = [max(0.0, alone_s), on_done]

    def advance(self, alone_s: float) -> None:
        progress = alone_s / self.slowdown(len(self.seqs))
        for seq in self.seqs.values():
            seq[0] -= progress

    def left(self) -> float:
        if self.waiting or not self.seqs:
            return math.inf
        return min(s[0] for s in self.seqs.values()) * self.slowdown(len(self.seqs))

    def settle(self) -> bool:
        done = [k for k, s in self.seqs.items() if s[0] <= EPS]
        for k in done:
            self.seqs.pop(k)[1]()
        return not self.seqs


# -- the simulation --------------------------------------------------------------------------------
class Simulation:
    def __init__(self, durations: Durations, system: SystemModel,
                 policies: dict[str, BatchPolicy] | None = None) -> None:
        self.durations = durations
        self.system = system
        self.policies = policies or {}
        self.now = 0.0
        self.groups: dict[str, list[Activity]] = {}
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.engines: dict[str, EngineSim] = {}

    # time and events
    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def start(self, group: str, activity: Activity) -> None:
        self.groups.setdefault(group, []).append(activity)

    def share(self, group: str, running: int) -> float:
        """The speed, relative to alone, of each of ``running`` activities on ``group``."""
        if running > 1 and group.startswith(CPU_GROUP):
            return self.durations.cpu_sharing / running
        return 1.0 / running

    def run(self) -> None:
        while True:
            t_event = self._events[0][0] if self._events else math.inf
            t_work = math.inf
            for group, acts in self.groups.items():
                running = [a for a in acts if not a.waiting]
                if running:
                    t_work = min(t_work, self.now + min(a.left() for a in running) / self.share(group, len(running)))
            t = min(t_event, t_work)
            if t == math.inf:
                return
            self._advance(t)
            self._settle()
            while self._events and self._events[0][0] <= self.now + EPS:
                heapq.heappop(self._events)[2]()

    def _advance(self, t: float) -> None:
        dt = max(0.0, t - self.now)
        for group, acts in self.groups.items():
            running = [a for a in acts if not a.waiting]
            if running and dt > 0:
                speed = self.share(group, len(running))
                for a in running:
                    a.advance(dt * speed)
        self.now = max(self.now, t)

    def _settle(self) -> None:
        while True:
            due = [(g, a) for g, acts in self.groups.items() for a in acts if a.left() <= EPS]
            if not due:
                return
            for group, activity in due:
                if activity.settle():
                    acts = self.groups[group]
                    if activity in acts:
                        acts.remove(activity)

    # engines
    def engine(self, node: NodeTrace) -> EngineSim:
        eng = self.engines.get(node.engine)
        if eng is None:
            policy = self.policies.get(node.engine) or default_policy(node.kind)
            # vLLM batches whatever is in flight for any client; the other engines' batching is the system's
            if not self.system.batching and node.kind != LLM_KIND:
                policy = BatchPolicy(max_batch_size=1, max_concurrent=10_000, priority="fifo")
            elif self.system.priority != policy.priority:
                policy = BatchPolicy(policy.max_batch_size, policy.max_wait_s, policy.max_batch_items,
                                     policy.max_concurrent, self.system.priority)
            cls = LLMEngineSim if node.kind == LLM_KIND else EngineSim
            eng = self.engines[node.engine] = cls(self, node.group, policy)
        return eng


@dataclass(order=True)
class Request:
    key: tuple
    node: NodeTrace = field(compare=False)
    on_done: Callable[[], None] = field(compare=False)


class EngineSim:
    """One engine's scheduler: a priority queue cut into batches by its policy."""

    def __init__(self, sim: Simulation, group: str, policy: BatchPolicy) -> None:
        self.sim, self.group, self.policy = sim, group, policy
        self.queue: list[Request] = []
        self.running = 0
        self.batch_sizes: list[int] = []
        self._dispatching = False

    def submit(self, node: NodeTrace, priority: Priority, on_done: Callable[[], None]) -> None:
        heapq.heappush(self.queue, Request(self.policy.key(priority, next(self.sim._seq)), node, on_done))
        if not self._dispatching:  # after everything else due now, as the runtime's loop turn
            self._dispatching = True
            self.sim.at(self.sim.now, self.dispatch)

    def dispatch(self) -> None:
        self._dispatching = False
        while self.queue and self.running < self.policy.max_concurrent:
            batch = self._cut()
            self.running += 1
            self.batch_sizes.append(len(batch))
            self._run(batch)

    def _run(self, batch: list[Request]) -> None:
        self.sim.start(self.group, Activity(self.sim.durations.batch([r.node for r in batch]),
                                            lambda: self._done(batch)))

    def _cut(self) -> list[Request]:
        """The next batch: the first request, then the next ones of the same op it admits."""
        ordered = sorted(self.queue)
        first = ordered[0]
        batch, items, rest = [first], first.node.items, []
        for r in ordered[1:]:
            if r.node.op == first.node.op and self.policy.admits(len(batch), int(items), int(r.node.items)):
                batch.append(r)
                items += r.node.items
            else:
                rest.append(r)
        self.queue = rest  # still sorted: a heap
        return batch

    def _done(self, batch: list[Request]) -> None:
        self.running -= 1
        for r in batch:
            r.on_done()
        self.dispatch()


class LLMEngineSim(EngineSim):
    """vLLM: prefills in batches, one at a time; decodes stepping together, waiting while a prefill runs."""

    def __init__(self, sim: Simulation, group: str, policy: BatchPolicy) -> None:
        # one prefill batch at a time, as many requests as the policy admits into it
        super().__init__(sim, group, BatchPolicy(policy.max_batch_size, 0.0, None, 1, policy.priority))
        self.decodes: DecodeLoop | None = None

    def submit(self, node: NodeTrace, priority: Priority, on_done: Callable[[], None]) -> None:
        if node.op != DECODE:
            return super().submit(node, priority, on_done)
        durations = self.sim.durations
        if self.decodes is None or self.decodes not in self.sim.groups.get(self.group, ()):
            self.decodes = DecodeLoop(lambda n, node=node: durations.decode_slowdown(node, n))
            self.sim.start(self.group, self.decodes)
        self.decodes.add(durations.alone(node), on_done)
        self.decodes.waiting = self.running > 0

    def dispatch(self) -> None:
        super().dispatch()
        self._hold_decodes()

    def _hold_decodes(self) -> None:
        if self.decodes is not None:  # vLLM runs a prefill's step before the decodes' next ones
            self.decodes.waiting = self.running > 0

    def _run(self, batch: list[Request]) -> None:
        """A prefill batch holds the engine (and its decodes) for as long as the profile
        measured a prefill stalling a decode beside it: vLLM's step that runs a prefill also
        advances the decodes, so they lose that step's extra time, not the prefill's whole
        recorded time. The rest of it (the request's way into the engine and back, its first
        token's) delays only its own requests."""
        nodes = [r.node for r in batch]
        total = self.sim.durations.batch(nodes)
        compute = min(total, self.sim.durations.prefill_stall(nodes))

        def computed() -> None:
            self.running -= 1
            self._hold_decodes()
            self.sim.at(self.sim.now + (total - compute), lambda: self._finish(batch))
            self.dispatch()
        self.sim.start(self.group, Activity(compute, computed))

    def _finish(self, batch: list[Request]) -> None:
        for r in batch:
            r.on_done()


class QueryRun:
    """One query's graph scheduler."""

    def __init__(self, sim: Simulation, trace: QueryTrace, arrival_s: float, on_done: Callable[[float], None]) -> None:
        self.sim, self.trace, self.arrival_s, self.on_done = sim, trace, arrival_s, on_done
        self.graphs = list(trace.graphs)
        self.outside_group = next((n.group for g in trace.graphs for n in g.nodes if n.kind == CPU_KIND),
                                  "engine:cpu")

    def start(self) -> None:
        self.sim.start(self.outside_group, Activity(self.trace.outside_s, self._next_graph))

    def _next_graph(self) -> None:
        if not self.graphs:
            self.on_done(self.sim.now)
            return
        GraphRun(self, self.graphs.pop(0), self._next_graph).start()


class GraphRun:
    """One graph of a query: dispatches each node once the nodes it waits for are done."""

    def __init__(self, query: QueryRun, graph: GraphTrace, on_done: Callable[[], None], after_s: float = 0.0,
                 critical_path_s: float | None = None) -> None:
        self.query, self.graph, self.on_done = query, graph, on_done
        self.sim = query.sim
        self.nodes = {n.name: n for n in graph.nodes}
        self.waiting = {n.name: {p for p in n.preds if p in self.nodes} for n in graph.nodes}
        self.users: dict[str, list[str]] = {n: [] for n in self.nodes}
        for name, preds in self.waiting.items():
            for p in preds:
                self.users[p].append(name)
        # as the runtime's GraphRun: a graph expanded at run time counts the work after its
        # node and keeps its query's critical path (the priority's latest starts)
        self.after_s = after_s
        self.remaining_s = {name: s + after_s for name, s in self._remaining_paths().items()}
        self.critical_path_s = (critical_path_s if critical_path_s is not None
                                else max(self.remaining_s.values(), default=after_s))
        self.left = len(self.nodes)
        self.ready: list[str] = []  # sequential systems: ready nodes not started yet, in trace order
        self.active = 0

    def _remaining_paths(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in reversed(self.graph.nodes):
            after = max((out.get(u, 0.0) for u in self.users[n.name]), default=0.0)
            out[n.name] = self.sim.durations.alone(n) + after
        return out

    def start(self) -> None:
        if not self.nodes:
            self.on_done()
            return
        for n in self.graph.nodes:
            if not self.waiting[n.name]:
                self._ready(n.name)
        self._pump()

    def _ready(self, name: str) -> None:
        self.ready.append(name)

    def _pump(self) -> None:
        order = {n.name: i for i, n in enumerate(self.graph.nodes)}
        self.ready.sort(key=order.__getitem__)
        while self.ready and (self.sim.system.overlap or self.active == 0):
            self._dispatch(self.nodes[self.ready.pop(0)])

    def _dispatch(self, node: NodeTrace) -> None:
        self.active += 1
        done = lambda: self._own_work_done(node)  # noqa: E731
        if node.kind == CPU_KIND:
            self.sim.start(node.group, Activity(self.sim.durations.alone(node), done))
            return
        priority = Priority(self.remaining_s[node.name], self.query.arrival_s, self.query.trace.query,
                            self.critical_path_s)
        self.sim.engine(node).submit(node, priority, done)

    def _own_work_done(self, node: NodeTrace) -> None:
        if node.expansion is not None:
            after = max((self.remaining_s[u] for u in self.users[node.name]), default=self.after_s)
            GraphRun(self.query, node.expansion, lambda: self._finished(node.name), after,
                     self.critical_path_s).start()
        else:
            self._finished(node.name)

    def _finished(self, name: str) -> None:
        self.active -= 1
        self.left -= 1
        for u in self.users[name]:
            self.waiting[u].discard(name)
            if not self.waiting[u]:
                self._ready(u)
        if self.left == 0:
            self.on_done()
        else:
            self._pump()


def simulate(traces: Sequence[QueryTrace], durations: Durations, system: SystemModel,
             arrivals: Sequence[float] | None = None,
             policies: dict[str, BatchPolicy] | None = None) -> list[QueryResult]:
    """Run ``traces`` (query ``i`` arriving at ``arrivals[i]``, or closed loop when None:
    each query starts as the previous one ends) and return each query's timing."""
    sim = Simulation(durations, system, policies)
    results: list[QueryResult | None] = [None] * len(traces)
    admitted: list[int] = [0]  # queries in flight
    waiting: list[tuple[int, float, Callable[[], None]]] = []  # over the cap: (query, arrival, then), FIFO

    def launch(i: int, then: Callable[[], None] = lambda: None, arrival: float | None = None) -> None:
        start = sim.now if arrival is None else arrival
        if system.max_queries is not None and admitted[0] >= system.max_queries:
            waiting.append((i, start, then))
            return
        admitted[0] += 1
        trace = traces[i]

        def finished(end: float) -> None:
            results[i] = QueryResult(trace.query, start, end)
            admitted[0] -= 1
            if waiting:
                j, arrived, after = waiting.pop(0)
                launch(j, after, arrived)
            then()
        QueryRun(sim, trace, start, finished).start()

    if arrivals is None:
        def closed_loop(i: int = 0) -> None:
            if i < len(traces):
                launch(i, lambda: closed_loop(i + 1))
        sim.at(0.0, closed_loop)
    else:
        if len(arrivals) != len(traces):
            raise ValueError(f"{len(traces)} traces but {len(arrivals)} arrival times")
        for i, t in enumerate(arrivals):
            sim.at(t, lambda i=i: launch(i))
    sim.run()
    unfinished = sum(r is None for r in results)
    if unfinished:  # a node waiting on something that never ran: a broken trace
        raise RuntimeError(f"simulation ended with {unfinished} of {len(traces)} queries unfinished")
    return results  # type: ignore[return-value]
