"""``TeolaRunnable(chain)``: the chain, traced into primitives, optimized, run on Teola.

    fast = TeolaRunnable(chain)
    fast.invoke({"question": "..."})     # same output as chain.invoke

It is a LangChain Runnable like any other (invoke / batch / stream, sync and async,
``with_config``, callbacks, ``|``). The chain is traced once per input layout (which keys a
dict input has; see ``InputLayout``), optimized once, then every call only executes.
Components the tracer cannot lower run unchanged inside the graph; ``explain()`` lists them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessageChunk
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig, RunnableSerializable
from langchain_core.runnables.config import (ContextThreadPoolExecutor, ensure_config, get_config_list, merge_configs,
                                             var_child_runnable_config)
from langchain_core.runnables.graph import Graph
from langchain_core.runnables.utils import AddableDict, gather_with_concurrency
from langchain_core.vectorstores import VectorStore
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ..capture.langchain import InputLayout, trace_runnable
from ..capture.langchain.rules.callbacks import streams_llm_calls
from ..runtime.caller import calling_from
from ..capture.vllm_identity import served_models
from ..ir.graph import PGraph
from ..errors import ConfigError
from ..optimizer import PassManager
from ..optimizer.cost import check_cost_model
from ..runtime.graph_scheduler import check_timeout
from ..runtime.runtime import Runtime, default_runtime
from ..runtime.bridge import stream_async, stream_sync
from ..served_calls import routed_aiterate, routed_iterate, routed_run_stream, routing_served_calls
from . import batch_group
from .called_chains import CalledChains, Lowering
from .graph_view import to_langchain_graph
from .plan import ExecutionPlan, SubPlans
from .retriever_run import ain_retriever_run, in_retriever_run, root_retriever
from ..recent import Recent
from .stream_split import StreamSplit

MAX_PLANS = 32  # traces kept per chain (one per input layout)
_END = object()  # the end of a stream iterated in another context
MAX_BATCH_THREADS = 64  # queries of one batch() in flight at once (one waiting thread each)


class TeolaRunnable(RunnableSerializable[Any, Any]):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    chain: Runnable
    runtime: Any = Field(default=None, exclude=True)
    """The Teola ``Runtime`` to run on; default: the one the chain's Teola models use, else
    ``default_runtime()``."""
    passes: list[str] | None = None  # optimizer passes (None: all, in the default order)
    disabled: list[str] = Field(default_factory=list)  # passes switched off (ablations)
    timeout_s: float | None = None  # per call
    cost_model: Any = Field(default=None, exclude=True)
    """The optimizer's ``CostModel``; default: the runtime's (which engines share hardware)."""

    _plans: Recent[ExecutionPlan] = PrivateAttr(default_factory=lambda: Recent(MAX_PLANS))  # by input layout
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _sub_plans: SubPlans | None = PrivateAttr(default=None)
    _split: tuple[StreamSplit | None] | None = PrivateAttr(default=None)  # None: not looked for yet
    _head: TeolaRunnable | None = PrivateAttr(default=None)  # runs a StreamSplit's head
    _called: CalledChains | None = PrivateAttr(default=None)  # the chains its runs' user code calls

    def __init__(self, chain: Any, *, runtime: Runtime | None = None, passes: Sequence[str] | None = None,
                 disabled: Sequence[str] = (), **kwargs: Any) -> None:
        if not isinstance(chain, Runnable):
            raise TypeError(f"TeolaRunnable wraps a LangChain Runnable; got {type(chain).__name__}. "
                            "Wrap functions in RunnableLambda and dicts in RunnableParallel first.")
        PassManager(passes, disabled)  # a misspelt pass name fails here, not at the first call
        if runtime is not None and not isinstance(runtime, Runtime):
            raise ConfigError(f"runtime must be a teola_plugin Runtime or None, got {type(runtime).__name__}")
        check_timeout(kwargs.get("timeout_s"))
        check_cost_model(kwargs.get("cost_model"))
        if isinstance(getattr(chain, "name", None), str):
            kwargs.setdefault("name", chain.name)  # a compiled graph's name=..., as plain's
        super().__init__(chain=chain, runtime=runtime, passes=None if passes is None else list(passes),
                         disabled=list(disabled), **kwargs)

    def with_config(self, config: RunnableConfig | None = None, **kwargs: Any) -> Runnable[Any, Any]:
        """Configured as the chain's own ``with_config`` configures it: a chain that is itself
        configured (a ``RunnableBinding``) replaces its config's keys (tags, metadata, run
        name), it does not add to them; run by Teola with the same settings."""
        if not isinstance(self.chain, RunnableBinding):
            return super().with_config(config, **kwargs)
        return TeolaRunnable(self.chain.with_config(config, **kwargs), runtime=self.runtime, passes=self.passes,
                             disabled=self.disabled, timeout_s=self.timeout_s, cost_model=self.cost_model)

    # -- what runs ---------------------------------------------------------------------------
    def teola_runtime(self) -> Runtime:
        if self.runtime is None:
            self.runtime = _runtime_in(self.chain) or default_runtime()
        return self.runtime

    def _plan(self, input: Any) -> ExecutionPlan:
        return self._plan_for(InputLayout.of(input))

    def _plan_for(self, layout: InputLayout) -> ExecutionPlan:
        with self._lock:
            plan = self._plans.get(layout)
            if plan is None or plan.trace.stale:  # new layout, or a component's settings changed
                sub = self._sub_planner()
                trace = trace_runnable(self.chain, layout, planner=sub, engine_models=sub.engine_models)
                plan = ExecutionPlan.build(trace, self.passes, self.disabled, self.teola_runtime(), self.cost_model,
                                           sub)
                self._plans.put(layout, plan)
            else:
                plan = self._plans.put(layout, plan.current(self.teola_runtime(), self.passes, self.disabled,
                                                            self._sub_planner()))
            return plan

    def _known_plan(self, layout: InputLayout) -> ExecutionPlan | None:
        """The plan kept for ``layout`` if it still fits the chain's components (a map read,
        without the tracing lock)."""
        plan = self._plans.get(layout)
        return plan if plan is not None and not plan.trace.stale else None

    def _sub_planner(self) -> SubPlans:
        """Plans for what ``RunnableEach`` / ``RunnableBranch`` decide at run time (called under the lock)."""
        if self._sub_plans is None:
            runtime = self.teola_runtime()
            self._sub_plans = SubPlans(runtime, served_models(runtime), self.passes, self.disabled, self.cost_model)
        return self._sub_plans

    def _plan_for_inspection(self, input: Any | None) -> ExecutionPlan:
        return self._plan(input) if input is not None else self._plan_for(InputLayout.example(self.chain))

    def start(self) -> Any:
        """Start Ray and the engines this chain's graph uses now, in the background, so that
        the first call does not pay for them; returns a ``concurrent.futures.Future``."""
        runtime = self.teola_runtime()
        graph = self._plan_for_inspection(None).graph
        engines = sorted({p.engine for p in graph.nodes if p.kind != "cpu"} & set(runtime.specs))
        return runtime.start_in_background(*engines)

    def trace(self, input: Any | None = None) -> PGraph:
        """The primitive graph as traced (module order kept), for ``input``'s layout."""
        return self._plan_for_inspection(input).trace.graph

    def explain(self, input: Any | None = None) -> str:
        """What the optimizer changed and which components stay opaque, and why."""
        return self._plan_for_inspection(input).explain()

    def get_graph(self, config: RunnableConfig | None = None, **kwargs: Any) -> Graph:
        """The chain's own graph, as plain's ``get_graph`` (code that inspects or draws a chain,
        a server's playground, sees its components); what runs: :meth:`primitive_graph`."""
        return self.chain.get_graph(config, **kwargs)

    def primitive_graph(self, input: Any | None = None) -> Graph:
        """The optimized primitive graph Teola runs for ``input`` (None: the chain traced without
        one) as a LangChain Graph: ``draw_mermaid()``, ``draw_png()``."""
        return to_langchain_graph(self._plan_for_inspection(input).graph)

    # -- schemas: the chain's ------------------------------------------------------------
    @property
    def InputType(self) -> Any:  # noqa: N802
        return self.chain.InputType

    @property
    def OutputType(self) -> Any:  # noqa: N802
        return self.chain.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self.chain.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self.chain.get_output_schema(config)

    # a LangGraph graph builds these from its state schemas, not from the pydantic models above
    def get_input_jsonschema(self, config: RunnableConfig | None = None) -> dict[str, Any]:
        return self.chain.get_input_jsonschema(config)

    def get_output_jsonschema(self, config: RunnableConfig | None = None) -> dict[str, Any]:
        return self.chain.get_output_jsonschema(config)

    def get_config_schema(self, *, include: Sequence[str] | None = None) -> type[BaseModel]:
        return self.chain.get_config_schema(include=include)

    def get_config_jsonschema(self, *, include: Sequence[str] | None = None) -> dict[str, Any]:
        return self.chain.get_config_jsonschema(include=include)

    def __getattr__(self, name: str) -> Any:
        """What the wrapped object has beyond a Runnable's (a LangGraph graph's ``get_state``,
        ``update_state``, ``get_state_history``, ``checkpointer``, ``nodes``; a legacy chain's
        ``run``, ``predict``, ``apply``), its own: its methods run as they are, their model-server
        calls through Teola's served engines, as the chain's own ``invoke`` does here."""
        try:
            return super().__getattr__(name)  # pydantic's private attributes
        except AttributeError:
            chain = self.__dict__.get("chain")
            if chain is None or name.startswith("__"):
                raise
            value = getattr(chain, name)
            if inspect.ismethod(value) and value.__self__ is chain:
                return self._routed(value)
            return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A legacy ``Chain``'s call, ``chain(inputs)``: its own, as its other methods."""
        return self._routed(self.chain.__call__)(*args, **kwargs)

    def _routed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` of the wrapped chain, run as it is with its model-server calls routed."""
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def routed_async(*args: Any, **kwargs: Any) -> Any:
                with self._running_as_is():
                    return await method(*args, **kwargs)
            return routed_async

        @functools.wraps(method)
        def routed(*args: Any, **kwargs: Any) -> Any:
            with self._running_as_is():
                return method(*args, **kwargs)
        return routed

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        """The wrapped chain's name (``RunnableSequence``...): callback runs are named as plain."""
        return super().get_name(suffix, name=name or self.name or self.chain.get_name())

    @property
    def config_specs(self) -> list[Any]:
        return self.chain.config_specs

    def get_prompts(self, config: RunnableConfig | None = None) -> list[Any]:
        return self.chain.get_prompts(config)

    # -- invoke / batch ------------------------------------------------------------------
    # Call-time keyword arguments (``.bind(stop=...)`` on the wrapper, LangGraph's
    # ``stream_mode``) go to the chain's first step in plain LangChain; the plan has no place
    # for them, so such a call runs the chain itself, unchanged (its model-server calls still
    # go through the served engines), as does a chain that puts no work on an engine.
    def _as_is(self, plan: ExecutionPlan | None, streaming: bool) -> bool:
        """The one rule for running the chain as it is: nothing of it runs on an engine (a
        LangGraph graph, an agent, a chain of functions and models Teola does not serve), or
        the caller streams — ``stream``, or a handler that streams models' tokens: LangGraph's
        ``stream_mode="messages"``, ``astream_events`` — and a lowered call would stream less
        than the model (a chat model with bound tools streams tool-call chunks, ``ChatOpenAI``
        the server's own chunks; the graph streams text). Then it runs with
        its own run tree, streams, config and batch, and its model-server calls on the served
        engines. Not with ``timeout_s``, which only a graph run enforces; a chain that cannot
        be traced (``plan`` None) takes the graph run, which reports why."""
        if self.timeout_s is not None or plan is None:
            return False
        return not plan.uses_engines or (streaming and not plan.trace.streams_text)

    def _traced_or_none(self, layout: InputLayout) -> ExecutionPlan | None:
        try:
            return self._plan_for(layout)
        except Exception:  # noqa: BLE001 - the graph run reports it, as for any input
            return None

    def _takes_as_is(self, plan: ExecutionPlan | None, streaming: bool = False) -> bool:
        return self.timeout_s is None and self._as_is(plan, streaming)

    def _call_as_is(self, plan: ExecutionPlan | None, config: RunnableConfig | None, sync: bool = False) -> bool:
        """Whether an ``invoke`` / ``ainvoke`` with ``config`` runs the chain as it is: also
        when the call's handlers stream the models' tokens and the graph run would not, and a
        sync call's ``max_concurrency`` limits steps the graph would run side by side (plain's
        ``invoke`` runs a parallel's branches that many at a time; ``ainvoke`` does not limit them)."""
        limited = sync and plan is not None and plan.side_by_side and bool((config or {}).get("max_concurrency"))
        return self._takes_as_is(plan, streams_llm_calls(config)) or (limited and self.timeout_s is None)

    def _runs_as_is(self, input: Any, streaming: bool = False) -> bool:
        return self._takes_as_is(self._traced_or_none(InputLayout.of(input)), streaming)

    async def _aplan(self, input: Any) -> ExecutionPlan:
        """``_plan`` without blocking the caller's event loop: a known plan is a map read (not
        the tracing lock), a new one is traced on a thread (tracing imports and inspects code)."""
        plan = self._known_plan(InputLayout.of(input))
        return plan if plan is not None else await asyncio.to_thread(self._plan, input)

    async def _aruns_as_is(self, input: Any, streaming: bool = False) -> bool:
        if self.timeout_s is not None:
            return False
        return self._as_is(await self._aplan_or_none(input), streaming)

    def _streams_as_is(self) -> bool:
        """For calls whose input arrives as a stream (``transform``): judged on the layout the
        chain's input schema describes, before the first chunk."""
        return self.timeout_s is None and self._as_is(self._traced_or_none(InputLayout.example(self.chain)), True)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        plan = None if kwargs else self._traced_or_none(InputLayout.of(input))
        if kwargs or self._call_as_is(plan, config, sync=True):
            with self._running_as_is():
                return self.chain.invoke(input, config, **kwargs)
        return self.invoke_graph(plan, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        plan = None if kwargs else await self._aplan_or_none(input)
        if kwargs or self._call_as_is(plan, config):
            with self._running_as_is():
                return await self.chain.ainvoke(input, config, **kwargs)
        return await self.ainvoke_graph(plan, input, config)

    def invoke_graph(self, plan: ExecutionPlan | None, input: Any, config: RunnableConfig | None) -> Any:
        """One call as a graph run (``plan``: the input's, when known), its callback runs plain's."""
        run = functools.partial(self._run, plan=plan)  # the plan found for it: not looked up again
        if self._reports_own_run(plan):
            return self._own_run_context(config).run(run, input)
        if (retriever := root_retriever(self.chain)) is not None:
            return in_retriever_run(retriever, run, input, self._bound_config(config))
        return self._call_with_config(run, input, self._bound_config(config))

    async def ainvoke_graph(self, plan: ExecutionPlan | None, input: Any, config: RunnableConfig | None) -> Any:
        run = functools.partial(self._arun, plan=plan)
        if self._reports_own_run(plan):
            return await asyncio.create_task(run(input), context=self._own_run_context(config))
        if (retriever := root_retriever(self.chain)) is not None:
            return await ain_retriever_run(retriever, run, input, self._bound_config(config))
        return await self._acall_with_config(run, input, self._bound_config(config))

    def graph_plan(self, input: Any, config: RunnableConfig | None) -> ExecutionPlan | None:
        """The plan ``invoke(input, config)`` runs as a graph; None when the chain runs as it
        is or cannot be traced (for a chain user code calls, ``called_chains``: it then runs
        its own ``invoke``)."""
        plan = self._traced_or_none(InputLayout.of(input))
        return None if plan is None or self._call_as_is(plan, config, sync=True) else plan

    async def agraph_plan(self, input: Any, config: RunnableConfig | None) -> ExecutionPlan | None:
        plan = await self._aplan_or_none(input)
        return None if plan is None or self._call_as_is(plan, config) else plan

    # -- the chain run as it is ----------------------------------------------------------
    # Its model-server calls go through the served engines, and the LCEL chains its code calls
    # (a LangGraph node's chain) run as their own graphs, with this runnable's settings.
    def _lowering(self, running: Runnable | None = None) -> Lowering:
        with self._lock:
            if self._called is None:
                self._called = CalledChains(self._for_called_chain)
            return Lowering(self._called, running)

    def _for_called_chain(self, chain: Runnable) -> TeolaRunnable:
        fast = TeolaRunnable(chain, runtime=self.teola_runtime(), passes=self.passes, disabled=self.disabled,
                             cost_model=self.cost_model)
        fast._called = self._called  # its own as-is runs lower through the same wrappers
        return fast

    def _running_as_is(self) -> Any:
        return routing_served_calls(self.teola_runtime(), lowers=self._lowering(self.chain))

    def _as_is_items(self, items: Iterator[Any]) -> Iterator[Any]:
        return routed_iterate(self.teola_runtime(), items, self._lowering(self.chain))

    def _as_is_aitems(self, items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        return routed_aiterate(self.teola_runtime(), items, self._lowering(self.chain))

    # A chain that is one component reporting its own run (a model, a retriever, a function
    # run as an opaque step) is that run in plain: no wrapper run around it, or handlers would
    # hear the run twice. The call's config is the context its graph runs in.
    @staticmethod
    def _reports_own_run(plan: ExecutionPlan | None) -> bool:
        return plan is not None and plan.trace.runs.root_reports_itself

    def _own_run_context(self, config: RunnableConfig | None) -> contextvars.Context:
        context = contextvars.copy_context()
        context.run(var_child_runnable_config.set, ensure_config(self._bound_config(config)))
        return context

    async def _aplan_or_none(self, input: Any) -> ExecutionPlan | None:
        known = self._known_plan(InputLayout.of(input))
        return known if known is not None else await asyncio.to_thread(self._traced_or_none, InputLayout.of(input))

    def _bound_config(self, config: RunnableConfig | None) -> RunnableConfig | None:
        """The call's config with what ``chain.with_config(...)`` bound to the chain's own run
        (its ``run_name``, tags, metadata), as the binding merges them in plain LangChain; the
        rest of the binding's config (callbacks, configurable) reaches its steps as before."""
        bound = self.chain.config if isinstance(self.chain, RunnableBinding) else None
        own = {k: bound[k] for k in ("run_name", "tags", "metadata") if bound and bound.get(k)}
        return merge_configs(own, config) if own else config

    def _run(self, input: Any, plan: ExecutionPlan | None = None) -> Any:
        """One graph run of ``input``; ``plan``: its plan when the caller has it (else traced
        now, which raises what makes the chain untraceable)."""
        group = batch_group.current()
        with batch_group.stopping(group):
            runtime, plan = self.teola_runtime(), plan or self._plan(input)
        run = plan.execute(runtime, input, timeout_s=self.timeout_s, lowers=self._lowering())
        if group is not None:  # an input of a batch that stops when another input fails
            return group.run(runtime, calling_from(None, run))
        return runtime.run_sync(calling_from(None, run))

    async def _arun(self, input: Any, plan: ExecutionPlan | None = None) -> Any:
        group = batch_group.current()
        with batch_group.stopping(group):
            runtime, plan = self.teola_runtime(), plan or await self._aplan(input)
        caller = asyncio.get_running_loop()
        run = plan.execute(runtime, input, timeout_s=self.timeout_s, lowers=self._lowering())
        if group is not None:  # an input of an abatch that stops when another input fails
            return await group.arun(runtime, calling_from(caller, run))
        return await runtime.run_async(calling_from(caller, run))

    def batch(self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None,
              *, return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """Up to ``MAX_BATCH_THREADS`` queries in flight at once (LangChain's default caps
        threads at a few), so the engines batch across them; outputs in input order. A
        ``max_concurrency`` the caller sets is LangChain's to apply, as plain."""
        if not inputs:
            return []
        if self._runs_as_is(inputs[0]):
            with self._running_as_is():
                return self.chain.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        configs = get_config_list(config, len(inputs))
        if kwargs or len(inputs) == 1 or any(c.get("max_concurrency") for c in configs):
            with batch_group.joined(None if return_exceptions or kwargs else batch_group.BatchGroup()):
                return super().batch(inputs, configs, return_exceptions=return_exceptions, **kwargs)

        def one(input: Any, config: RunnableConfig) -> Any:
            try:
                return self.invoke(input, config)
            except Exception as exc:
                if return_exceptions:
                    return exc
                if group is not None:
                    group.fail(exc)
                raise

        # an input's error stops the rest, as plain; not through the configs' max_concurrency:
        # that would reach every nested runnable
        with batch_group.joined(None if return_exceptions else batch_group.BatchGroup()) as group, \
                ContextThreadPoolExecutor(max_workers=min(len(inputs), MAX_BATCH_THREADS)) as pool:
            return list(pool.map(one, inputs, configs))

    async def abatch(self, inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None = None,
                     *, return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """All queries at once (``ainvoke`` each), so the engines batch across them; a chain
        that runs as it is runs its own ``abatch``."""
        if inputs and await self._aruns_as_is(inputs[0]):
            with self._running_as_is():
                return await self.chain.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        if return_exceptions or kwargs or not inputs:
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        configs = get_config_list(config, len(inputs))

        async def one(input: Any, config: RunnableConfig) -> Any:
            try:
                return await self.ainvoke(input, config)
            except Exception as exc:
                group.fail(exc)
                return exc

        # an input's error stops the rest, as plain; every input's run has ended (the others'
        # with the failure) before it is raised
        with batch_group.joined(batch_group.BatchGroup()) as group:
            outputs = await gather_with_concurrency(configs[0].get("max_concurrency"), *map(one, inputs, configs))
        if group.failure is not None:
            raise group.failure
        return outputs

    def batch_as_completed(self, inputs: Sequence[Any], config: RunnableConfig | Sequence[RunnableConfig] | None = None,
                           *, return_exceptions: bool = False, **kwargs: Any) -> Iterator[tuple[int, Any]]:
        if inputs and self._runs_as_is(inputs[0]):
            items = self.chain.batch_as_completed(inputs, config, return_exceptions=return_exceptions, **kwargs)
            yield from self._as_is_items(items)
            return
        yield from super().batch_as_completed(inputs, config, return_exceptions=return_exceptions, **kwargs)

    def abatch_as_completed(self, inputs: Sequence[Any], config: RunnableConfig | Sequence[RunnableConfig] | None = None,
                            *, return_exceptions: bool = False, **kwargs: Any) -> AsyncIterator[tuple[int, Any]]:
        options = {"return_exceptions": return_exceptions, **kwargs}
        return self._chain_or_own(
            lambda: self._aruns_as_is(inputs[0]) if inputs else _false(),
            lambda: self.chain.abatch_as_completed(inputs, config, **options),
            lambda: super(TeolaRunnable, self).abatch_as_completed(inputs, config, **options))

    # -- streaming -----------------------------------------------------------------------
    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        plan = None if kwargs else self._traced_or_none(InputLayout.of(input))
        if kwargs or self._takes_as_is(plan, streaming=True):
            yield from self._as_is_items(self.chain.stream(input, config, **kwargs))
            return
        if self._reports_own_run(plan):
            context, chunks = self._own_run_context(config), self._graph_chunks(input)
            try:
                while (chunk := context.run(next, chunks, _END)) is not _END:
                    yield chunk
            finally:
                context.run(chunks.close)
            return
        if root_retriever(self.chain) is not None:  # a retriever streams its invoke: one run, one chunk
            yield self.invoke_graph(plan, input, config)
            return
        yield from self._transform_stream_with_config(iter([input]), self._stream_chunks,
                                                      self._bound_config(config))

    def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        async def single() -> AsyncIterator[Any]:
            yield input

        return self._chain_or_own(
            lambda: _true() if kwargs else self._aruns_as_is(input, streaming=True),
            lambda: self.chain.astream(input, config, **kwargs),
            lambda: self._astream_own_or_wrapped(input, config, single))

    async def _astream_own_or_wrapped(self, input: Any, config: RunnableConfig | None,
                                      single: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        plan = await self._aplan_or_none(input)
        if not self._reports_own_run(plan):
            if root_retriever(self.chain) is not None:  # as stream: one run, one chunk
                yield await self.ainvoke_graph(plan, input, config)
                return
            chunks = self._atransform_stream_with_config(single(), self._astream_chunks, self._bound_config(config))
            async with aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
            return
        context, chunks = self._own_run_context(config), self._agraph_chunks(input)
        try:
            while True:
                try:
                    chunk = await asyncio.create_task(chunks.__anext__(), context=context)
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            await asyncio.create_task(chunks.aclose(), context=context)

    def transform(self, input: Iterator[Any], config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        """A chain that runs as it is consumes its input stream itself (a passthrough streams
        chunks as they come); otherwise the input is gathered and the call streamed, as
        LangChain does for a runnable without its own ``transform``."""
        if self._streams_as_is():
            yield from self._as_is_items(self.chain.transform(input, config, **kwargs))
            return
        yield from super().transform(input, config, **kwargs)

    def atransform(self, input: AsyncIterator[Any], config: RunnableConfig | None = None,
                   **kwargs: Any) -> AsyncIterator[Any]:
        return self._chain_or_own(lambda: asyncio.to_thread(self._streams_as_is),
                                  lambda: self.chain.atransform(input, config, **kwargs),
                                  lambda: super(TeolaRunnable, self).atransform(input, config, **kwargs))

    # The event and log streams of a chain that runs as it is are its own (same runs, same
    # names); otherwise LangChain builds them from this runnable's ``astream``. The typed run
    # stream (``version="v3"``, beta: a LangGraph graph's, a chat model's) is the chain's own,
    # its model-server calls routed; on a chain without one it raises what plain's raises.
    def astream_events(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if kwargs.get("version") == "v3":
            return self._arun_stream(input, config, **kwargs)
        return self._chain_or_own(lambda: self._aruns_as_is(input, streaming=True),
                                  lambda: self.chain.astream_events(input, config, **kwargs),
                                  lambda: super(TeolaRunnable, self).astream_events(input, config, **kwargs))

    async def _arun_stream(self, input: Any, config: RunnableConfig | None, **kwargs: Any) -> Any:
        run = await self.chain.astream_events(input, config, **kwargs)
        return routed_run_stream(self.teola_runtime(), run, self._lowering(self.chain))

    def stream_events(self, input: Any, config: RunnableConfig | None = None, *, version: str = "v2",
                      **kwargs: Any) -> Any:
        if version != "v3":
            return super().stream_events(input, config, version=version, **kwargs)
        run = self.chain.stream_events(input, config, version="v3", **kwargs)
        return routed_run_stream(self.teola_runtime(), run, self._lowering(self.chain))

    def astream_log(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        return self._chain_or_own(lambda: self._aruns_as_is(input, streaming=True),
                                  lambda: self.chain.astream_log(input, config, **kwargs),
                                  lambda: super(TeolaRunnable, self).astream_log(input, config, **kwargs))

    async def _chain_or_own(self, runs_as_is: Callable[[], Awaitable[bool]],
                            chain_items: Callable[[], AsyncIterator[Any]],
                            own_items: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        """An async stream: the chain's own (its model-server calls routed) when it runs as it
        is, else this runnable's. Returned, not wrapped, by the public methods, so closing the
        caller's stream closes the chain's at once (breaking out of ``astream_events`` cancels
        its steps, as plain)."""
        items = self._as_is_aitems(chain_items()) if await runs_as_is() else own_items()
        async with aclosing(items):
            async for item in items:
                yield item

    def _stream_split(self) -> StreamSplit | None:
        """Where a stream leaves the graph for the chain's own ``transform`` (see
        ``StreamSplit``); decided once per chain. Not with ``timeout_s``: only a graph run
        enforces it."""
        with self._lock:
            if self._split is None:
                split = None
                if self.timeout_s is None:
                    split = StreamSplit.of(self.chain, self._sub_planner().uses_engines)
                self._split = (split,)
                self._head = None if split is None else TeolaRunnable(
                    split.head, runtime=self.teola_runtime(), passes=self.passes, disabled=self.disabled,
                    cost_model=self.cost_model)
            return self._split[0]

    def _stream_chunks(self, inputs: Iterator[Any], run_manager: CallbackManagerForChainRun,
                       config: RunnableConfig) -> Iterator[Any]:
        input = _last(inputs)
        split = self._stream_split()
        if split is None:
            yield from self._graph_chunks(input)
            return
        head_chunks = self._head._graph_chunks(input)
        yield from routed_iterate(self.teola_runtime(), split.pipe(head_chunks, config, run_manager), self._lowering())

    async def _astream_chunks(self, inputs: AsyncIterator[Any], run_manager: AsyncCallbackManagerForChainRun,
                              config: RunnableConfig) -> AsyncIterator[Any]:
        input = None
        async for input in inputs:  # noqa: B007
            pass
        split = await asyncio.to_thread(self._stream_split)  # traces the steps: not on the caller's loop
        if split is None:
            chunks = self._agraph_chunks(input)
        else:
            chunks = routed_aiterate(self.teola_runtime(),
                                     split.apipe(self._head._agraph_chunks(input), config, run_manager),
                                     self._lowering())
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk

    def _graph_chunks(self, input: Any) -> Iterator[Any]:
        """The stream of one graph run of the chain: its output's token deltas and fields."""
        runtime, plan = self.teola_runtime(), self._plan(input)
        chunks, lowers = _Chunks(plan), self._lowering()
        run = lambda push: calling_from(None, chunks.execute(plan, runtime, input, push,  # noqa: E731
                                                              self.timeout_s, lowers))
        for final, item in stream_sync(runtime, run):
            yield from chunks.finish(item) if final else (item,)

    async def _agraph_chunks(self, input: Any) -> AsyncIterator[Any]:
        runtime, plan = self.teola_runtime(), await self._aplan(input)
        chunks, lowers = _Chunks(plan), self._lowering()
        caller = asyncio.get_running_loop()
        run = lambda push: calling_from(caller, chunks.execute(plan, runtime, input, push,  # noqa: E731
                                                                self.timeout_s, lowers))
        async for final, item in stream_async(runtime, run):
            for chunk in chunks.finish(item) if final else (item,):
                yield chunk


class _Chunks:
    """One call's stream chunks, as the chain streams them: the output's token deltas (str,
    or ``AIMessageChunk`` for a chat reply); for a dict output, ``AddableDict`` chunks — one
    per field when it is ready, the streaming field's deltas as ``{key: delta}``; the
    output at once when nothing streamed."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.shape = plan.trace.output
        self.group_of = {k: group for group in self.shape.field_groups for k in group}
        self.ready: dict[str, Any] = {}
        self.sent: set[str] = set()
        self.streamed = False

    def _delta(self, text: str) -> Any:
        return AIMessageChunk(content=text) if self.shape.streams == "message" else text

    async def execute(self, plan: ExecutionPlan, runtime: Runtime, input: Any, push: Any,
                      timeout_s: float | None, lowers: Lowering | None = None) -> Any:
        key = self.shape.streaming_field

        def token(text: str) -> None:
            self.streamed = True
            if key is None:
                push(self._delta(text))
            else:
                self.sent.add(key)
                push(AddableDict({key: self._delta(text)}))

        def field(name: str, value: Any) -> None:
            self.ready[name] = value
            group = self.group_of.get(name, (name,))
            if all(k in self.ready for k in group):
                self.streamed = True
                self.sent.update(group)
                push(AddableDict({k: self.ready[k] for k in group}))

        return await plan.execute(runtime, input, on_token=token, timeout_s=timeout_s,
                                  on_field=field if self.shape.fields is not None else None, lowers=lowers)

    def finish(self, output: Any) -> Iterator[Any]:
        """What is left to send once the run returned ``output``."""
        if self.shape.fields is not None and isinstance(output, Mapping):
            missing = [k for k in self.shape.fields if k not in self.sent and k in output]  # no tokens came
            yield from (AddableDict({k: output[k]}) for k in missing)
        elif not self.streamed:
            yield output


async def _true() -> bool:
    return True


async def _false() -> bool:
    return False


def _last(items: Iterator[Any]) -> Any:
    value = None
    for value in items:  # noqa: B007
        pass
    return value


def _runtime_in(root: Any) -> Runtime | None:
    """The runtime of the first Teola model / embeddings found inside a chain."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "teola_runtime") and getattr(obj, "runtime", None) is not None:
            return obj.runtime
        if isinstance(obj, BaseModel):
            children: list[Any] = list(obj.__dict__.values())
        elif isinstance(obj, VectorStore):
            children = [getattr(obj, "embedding", None), getattr(obj, "embeddings", None)]
        elif isinstance(obj, (list, tuple)):
            children = list(obj)
        elif isinstance(obj, dict):
            children = list(obj.values())
        else:
            continue
        stack.extend(c for c in children if isinstance(c, (Runnable, VectorStore, Embeddings, list, tuple, dict)))
    return None
