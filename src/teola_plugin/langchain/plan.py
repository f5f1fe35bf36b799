"""An execution plan: one optimized trace of a chain, bound to a runtime and ready to run.

``TeolaRunnable`` keeps one plan per input layout (see ``InputLayout``): tracing and
optimizing happen once, every later call only executes. ``SubPlans`` does the same at
run time for the sub-chains of ``RunnableEach`` / ``RunnableBranch`` (the tracer's
``SubPlanner``): one plan per (sub-chain, input layout), its engines provided before it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables.config import ensure_config

from ..capture.langchain import InputLayout, LangChainTrace, trace_runnable
from ..capture.langchain.rules.callbacks import streams_llm_calls
from ..capture.langchain.run_scopes import binding_config
from ..capture.common import EXPANDING_HEADER
from ..capture.langchain.tracer import FIELD_OUTPUT, SubPlan, text_tokens
from ..capture.opaque_warnings import probing
from ..capture.vllm_identity import ServedModel
from .called_chains import EXPLAIN_CALLED
from ..recent import Recent
from .run_tree import RunTree, SubChainRun, listening
from ..ir.graph import PGraph
from ..ir.ops import Op
from ..optimizer import optimize
from ..runtime import app_runs
from ..runtime.runtime import Runtime
from ..served_calls import EXPLAIN_ROUTED, routing_served_calls


@dataclass
class ExecutionPlan:
    trace: LangChainTrace
    graph: PGraph  # optimized
    uses_engines: bool = True
    """Whether a run puts work on an engine (a lowered model, embedding, or a
    ``RunnableBranch`` / ``.map()`` into a sub-chain that has one). A chain that does not
    gains nothing from the graph run: ``TeolaRunnable`` runs it as it is (its model-server
    calls still go through the served engines). A search of the user's own store alone does
    not count: with its query embedding the model's own step, it is the store's own call."""

    cost: Any = None  # the runtime's cost model it was optimized with (None: the caller's own)
    side_by_side: bool = False
    """Whether two of its engine calls or opaque steps may run at once (a parallel's branches):
    what a call's ``max_concurrency`` limits in plain LangChain's sync ``invoke``."""

    @classmethod
    def build(cls, trace: LangChainTrace, passes: Sequence[str] | None = None,
              disabled: Iterable[str] = (), runtime: Runtime | None = None,
              cost_model: Any = None, sub_plans: SubPlans | None = None) -> ExecutionPlan:
        """Optimize ``trace`` with ``cost_model``, else ``runtime``'s (which engines share hardware)."""
        runtimes = runtime.cost_model(trace.engines) if runtime is not None and cost_model is None else None
        graph = optimize(trace.graph, passes=passes, disabled=disabled, cost_model=cost_model or runtimes)
        return cls(trace, graph, _uses_engines(trace.graph, sub_plans, set(trace.stores.values())), runtimes,
                   _runs_side_by_side(graph))

    def current(self, runtime: Runtime, passes: Sequence[str] | None, disabled: Iterable[str],
                sub_plans: SubPlans | None) -> ExecutionPlan:
        """This plan, or the same trace optimized again when the runtime learnt something since
        (a model server's prefix cache, detected when its engine started)."""
        if self.cost is None or runtime.cost_model(self.trace.engines) is self.cost:
            return self
        return ExecutionPlan.build(self.trace, passes, disabled, runtime, None, sub_plans)

    def graph_inputs(self, input: Any) -> dict[str, Any]:
        return self.trace.feed(input)

    async def execute(self, runtime: Runtime, input: Any, *, timeout_s: float | None = None,
                      on_token: Callable[[str], None] | None = None,
                      on_field: Callable[[str, Any], None] | None = None, lowers: Any = None) -> Any:
        """Run one call on the runtime loop; ``on_token`` receives the output's text deltas,
        ``on_field`` a dict output's other fields (key, value) as each is ready; ``lowers``:
        what lowers the chains its opaque steps call (``called_chains.Lowering``)."""
        await runtime.provide(self.trace.engines)  # its stores' and model servers' engines
        tokens = self.trace.output.tokens_from

        def field_ready(name: str, value: Any) -> None:
            if name.startswith(FIELD_OUTPUT):
                on_field(name[len(FIELD_OUTPUT):], value)  # type: ignore[misc]

        config = ensure_config()  # the chain's run's child config: the caller's callbacks
        runs = RunTree(self.trace.runs, self.graph, config) if self.trace.runs and listening(config) else None
        # opaque steps' calls go to the served engines, as parts of this call's run
        with app_runs.app_run("langchain"), routing_served_calls(runtime, app_runs.call_priority(), lowers):
            out = await runtime.execute(
                self.graph, self.graph_inputs(input), timeout_s=timeout_s,
                on_token=(lambda text: text and on_token(text)) if on_token else None,
                token_nodes=frozenset({tokens}) if tokens and on_token else frozenset(),
                on_output=field_ready if on_field else None, stream_llm_calls=streams_llm_calls(),
                observer=runs)
        return out["output"]

    def explain(self) -> str:
        lines = [self.graph.explain().rstrip("\n")]
        if self.trace.opaque:
            lines.append("Opaque components (run unchanged, as LangChain would run them):")
            lines += [f"  - {o.component} (primitive {o.node!r}): {o.reason}" for o in self.trace.opaque]
            lines += [EXPLAIN_ROUTED, EXPLAIN_CALLED]
        else:
            lines.append("Opaque components: none (every component was lowered to primitives)")
        if self.trace.expanding:
            lines.append(EXPANDING_HEADER)
            lines += [f"  - {note}" for note in self.trace.expanding]
        return "\n".join(lines) + "\n"


def _uses_engines(graph: PGraph, sub_plans: SubPlans | None, store_engines: set[str]) -> bool:
    for prim in graph.nodes:
        if prim.kind != "cpu" and prim.engine not in store_engines:
            return True
        if any(sub_plans is None or sub_plans.uses_engines(r) for r in prim.attrs.get("expands_into", ())):
            return True
    return False


def _runs_side_by_side(graph: PGraph) -> bool:
    """Whether two engine calls or opaque steps of ``graph`` are unordered (may run at once)."""
    ancestors: dict[str, int] = {}  # node -> bit set of the nodes it waits on
    bits: dict[str, int] = {}
    work = 0  # bit set of the engine calls and opaque steps seen so far
    for i, name in enumerate(graph.topological_order()):
        bits[name] = 1 << i
        before = 0
        for pred in graph.predecessors(name):
            before |= ancestors[pred] | bits[pred]
        ancestors[name] = before
        prim = graph[name]
        if prim.kind != "cpu" or prim.op is Op.OPAQUE:
            if work & ~before:  # an earlier one it does not wait on
                return True
            work |= bits[name]
    return False


class SubPlans:
    """Plans for sub-chains met at run time, on one runtime, with the parent's optimizer settings."""

    MAX_PLANS = 128

    def __init__(self, runtime: Runtime, engine_models: Mapping[str, ServedModel | str],
                 passes: Sequence[str] | None = None, disabled: Iterable[str] = (), cost_model: Any = None) -> None:
        self.runtime, self.cost_model = runtime, cost_model
        self.engine_models = dict(engine_models)
        self.passes, self.disabled = passes, tuple(disabled)
        self._plans: Recent[ExecutionPlan] = Recent(self.MAX_PLANS)  # by (id(runnable), layout)

    def plan(self, runnable: Any, layout: InputLayout) -> ExecutionPlan:
        key = (id(runnable), layout)
        known = self._plans.get(key)
        if known is not None and not known.trace.stale:
            plan = known.current(self.runtime, self.passes, self.disabled, self)
            return plan if plan is known else self._plans.put(key, plan, keep=runnable)
        trace = trace_runnable(runnable, layout, planner=self, engine_models=self.engine_models)
        plan = ExecutionPlan.build(trace, self.passes, self.disabled, self.runtime, self.cost_model, self)
        return self._plans.put(key, plan, keep=runnable)

    def uses_engines(self, runnable: Any) -> bool:
        """Whether ``runnable`` (a sub-chain met at run time) may put work on an engine,
        judged on the layout its input schema describes; when it cannot be traced, yes."""
        try:
            with probing():
                return self.plan(runnable, InputLayout.example(runnable)).uses_engines
        except Exception:  # noqa: BLE001 - its run traces it again and reports what fails
            return True

    def engine_specs(self) -> Mapping[str, Any]:
        return self.runtime.specs

    async def sub_plan(self, runnable: Any, input: Any, tag: str | None = None) -> SubPlan:
        """Called by an expanding primitive on the runtime loop; tracing runs off the loop.
        When the caller's callbacks listen, the plan reports the sub-chain's run tree under the
        expanding component's run (``tag``: the one the sub-chain's run carries there)."""
        layout = InputLayout.of(input)
        known = self._plans.get((id(runnable), layout))
        plan = known if known is not None and not known.trace.stale else await asyncio.to_thread(
            self.plan, runnable, layout)
        await self.runtime.provide(plan.trace.engines)
        config = ensure_config()  # the expanding component's run's child config
        observer = None
        if listening(config):
            own = SubChainRun(runnable.get_name(), tag, binding_config(runnable), input)
            observer = RunTree(plan.trace.runs, plan.graph, config, own)
        return SubPlan(plan.graph, plan.graph_inputs(input), text_tokens(plan.trace.output), observer)
