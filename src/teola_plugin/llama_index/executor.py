"""``TeolaExecutor``: trace a LlamaIndex query engine or retriever, optimize, run on the runtime.

    Settings.executor = TeolaExecutor()          # drop-in: query / retrieve now run on Teola
    executor.query(query_engine, "question")     # or explicitly
    print(executor.explain(query_engine))        # passes applied, graph, what stayed opaque

Each call traces the object as it is now (so a changed ``similarity_top_k`` is honoured),
optimizes the graph and runs it as one query; the result is the framework's own type
(``Response`` with ``source_nodes``, or a ``NodeWithScore`` list). With the executor
installed, building a ``VectorStoreIndex`` (``from_documents`` / ``insert``) over LlamaIndex's
in-memory stores defers its nodes into the next query's graph (``pending_ingestion.py``;
:meth:`TeolaExecutor.flush` stores them now); over any other store (``ingestion_policy.py``),
or with ``defer_ingestion=False``, the nodes are embedded through the executor and stored
before the call returns (:meth:`TeolaExecutor.embed_index_nodes`). No optimizer or scheduler
logic lives here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import queue
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.chat_engine.types import BaseChatEngine
from llama_index.core.schema import QueryBundle

from ..capture.common import EXPANDING_HEADER, Trace
from ..capture.llama_index import SUPPORTED, NotLowerable, TraceContext, TracedApp, framework_passthrough, trace
from ..capture.llama_index_models import embedder_engine_for, llm_call_spec
from ..capture.llama_index_served import is_served_llm
from ..capture.lowerable import LowerableLLM
from ..capture.llama_index_rules import synthesis_planner
from ..capture.llama_index_embed_events import EmbedEvents, insert_batches
from ..capture.llama_index_llm_events import ReadPace, failed_calls_reported
from ..capture.llama_index_ingest import embedding_graph
from ..errors import ConfigError
from ..ir.graph import PGraph
from ..optimizer.cost import CostModel, check_cost_model
from ..optimizer.manager import PassManager
from ..runtime import app_runs
from ..runtime.caller import calling_from
from ..runtime.engine_needs import EngineNeeds
from ..runtime.framework_threads import in_framework_thread
from ..runtime.graph_scheduler import check_timeout
from ..served_calls import EXPLAIN_ROUTED, embedding_calls
from ..runtime.runtime import Runtime, default_runtime
from . import instrumentation
from .pending_ingestion import IDLE_FLUSH_S, PendingIngestion, flush_all, pending_states


# The executor running the current call: the framework calls made inside it (an opaque
# component's own sub-queries) are its to run even when it is not ``Settings.executor``.
_RUNNING: contextvars.ContextVar[TeolaExecutor | None] = contextvars.ContextVar("teola_executor", default=None)


def running_executor() -> TeolaExecutor | None:
    return _RUNNING.get()


@contextlib.contextmanager
def _running(executor: TeolaExecutor) -> Iterator[None]:
    embedding_calls.install()  # an embedding class imported since the integration loaded
    token = _RUNNING.set(executor)
    try:
        yield
    finally:
        _RUNNING.reset(token)


@contextlib.contextmanager
def _chat_turn(executor: TeolaExecutor, chat_engine: Any, method: str) -> Iterator[None]:
    """One turn of a chat engine's own code: the executor marked running, the turn one app run."""
    _require(chat_engine, BaseChatEngine, method)
    with _running(executor), app_runs.app_run("chat"):
        yield


class TeolaExecutor:
    """Runs LlamaIndex query engines and retrievers on a Teola :class:`Runtime`.

    Args:
        runtime: where engines live; ``None`` = the process-wide ``default_runtime()``
            (embedded Ray and the default engines), shared with TeolaLLM / TeolaEmbedding.
        passes / disabled: optimizer passes to run / to switch off (names checked here).
        optimize: ``False`` runs the traced graph as traced (module order).
        timeout_s: bound on each query (``QueryTimeoutError``), ``None`` for none.
        ray_address: join this Ray cluster (``"host:6379"``, ``"auto"``) with the default
            engines instead of an embedded one. It connects here, so a wrong address fails
            at construction with ``ConfigError``.
        defer_ingestion: ``True`` (default): ``VectorStoreIndex.from_documents`` / ``insert``
            into LlamaIndex's in-memory stores record their nodes and the next query on the
            index embeds and inserts them in its own graph (every other read path flushes
            first; :meth:`flush` does it now). A durable or shared store (persistent Chroma,
            a server, a database docstore) is always written before the call returns, as in
            plain LlamaIndex. ``False``: every index embeds through Teola at call time and
            returns when stored. ``explain()`` says which path an index took.
        idle_flush_s: deferred nodes nobody claimed for this long are stored in the
            background (``None``: only queries, reads and ``persist()`` store them).
        cost_model: the optimizer's :class:`CostModel` (e.g. from a measured profile file);
            ``None`` = the runtime's (``Runtime.cost_model()``: default profiles and which
            engines share hardware, so a CPU-only machine is not planned as a GPU cluster).
        start_engines: ``True`` (default): start Ray and the engines the app's models use
            (:meth:`start`) in the background now, so that the first query waits only for
            what is not ready yet instead of paying for every start; ``self.started`` is its
            future. ``False``: everything starts inside the first query that needs it.
    """

    def __init__(self, runtime: Runtime | None = None, *, passes: Sequence[str] | None = None,
                 disabled: Iterable[str] = (), optimize: bool = True, timeout_s: float | None = None,
                 ray_address: str | None = None, defer_ingestion: bool = True,
                 idle_flush_s: float | None = IDLE_FLUSH_S, cost_model: CostModel | None = None,
                 start_engines: bool = True) -> None:
        if runtime is not None and not isinstance(runtime, Runtime):
            raise ConfigError(f"runtime must be a teola_plugin Runtime or None, got {type(runtime).__name__}")
        if ray_address is not None:
            if runtime is not None:
                raise ConfigError("pass either runtime or ray_address, not both")
            if not isinstance(ray_address, str) or not ray_address.strip():
                raise ConfigError(f"ray_address must be a non-empty string such as 'host:6379' or 'auto', "
                                  f"got {ray_address!r}")
            runtime = Runtime(ray_address=ray_address).start()
        self._passes = PassManager(passes, disabled)  # unknown names fail here, not mid-query
        self.cost_model = check_cost_model(cost_model)
        self.optimize = bool(optimize)
        self.timeout_s = check_timeout(timeout_s)  # 0, NaN, inf, a string: ConfigError now, not mid-query
        self._runtime = runtime
        self.defer_ingestion = bool(defer_ingestion)
        self.idle_flush_s = check_timeout(idle_flush_s, name="idle_flush_s")
        self._context: TraceContext | None = None
        self.last_query_id: str | None = None  # for the runtime timeline of the latest run
        embedding_calls.install()  # the app's embedding class, if loaded: its calls in steps Teola runs as they are
        self.started: concurrent.futures.Future[None] | None = self.start() if start_engines else None

    def start(self, *engines: str) -> concurrent.futures.Future[None]:
        """Start Ray and the engines the app will use now, in the background (default: the
        embedder unless ``Settings.embed_model`` is a model no engine serves, and the vLLM
        engine when ``Settings.llm`` is Teola's own), so that the first query does not pay
        for them; returns a ``concurrent.futures.Future``. A model server the app calls
        needs no start."""
        return self.runtime.start_in_background(*(engines or self._engines_of_settings()))

    def _engines_of_settings(self) -> tuple[str, ...]:
        from llama_index.core import Settings

        # Settings._llm / _embed_model, not the properties: those would resolve (and import)
        # OpenAI's defaults
        embed, llm = Settings._embed_model, Settings._llm
        embedder = "embedder" if embed is None else embedder_engine_for(self.runtime, embed)[0]
        on_vllm = isinstance(llm, LowerableLLM) or type(llm).__name__ == "Vllm"
        return tuple(name for name in (embedder, "llm" if on_vllm else None) if name in self.runtime.specs)

    def __repr__(self) -> str:
        return f"TeolaExecutor(passes={self._passes.names if self.optimize else []}, timeout_s={self.timeout_s})"

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = default_runtime()
        return self._runtime

    # -- tracing ---------------------------------------------------------------------------------
    def _trace_context(self) -> TraceContext:
        if self._context is None:
            self._context = TraceContext(self.runtime, prepare_expansion=self._prepare,
                                         pending_of=PendingIngestion.of)
        self._context.join_ingestion = self.defer_ingestion
        return self._context

    def _prepare(self, graph: PGraph, engines: EngineNeeds | None = None) -> PGraph:
        """``graph`` optimized (``engines``: its trace's, counted before they are provided)."""
        return self._passes.run(graph, self.cost_model or self.runtime.cost_model(engines)) if self.optimize else graph

    def traced(self, target: Any, *, join_ingestion: bool = True) -> TracedApp:
        """The trace with its bookkeeping (bound inputs, the engines it needs, notes)."""
        if isinstance(target, BaseChatEngine) or _is_workflow(target):
            raise TypeError(f"{type(target).__name__} has no graph of its own to trace: it runs its own code "
                            "(memory, prompts, steps) and the query engines, retrievers and models it calls are "
                            "lowered as it calls them; executor.explain() on it says which")
        ctx = self._trace_context()
        if not join_ingestion:  # a copy: the shared context may be tracing in another thread
            ctx = dataclasses.replace(ctx, join_ingestion=False)
        return trace(target, ctx)

    def trace(self, target: Any) -> PGraph:
        """The primitive graph of ``target`` as traced (module order, before optimization)."""
        return self.traced(target).graph

    def explain(self, target: Any) -> str:
        """Passes applied, the optimized graph as mermaid, and which components stayed opaque."""
        if isinstance(target, BaseChatEngine):
            return self._explain_chat_engine(target)
        if _is_workflow(target):
            return "\n".join([f"TeolaExecutor plan for {type(target).__name__}", "",
                              "The workflow (an agent, a Workflow) runs its steps as LlamaIndex does: they are "
                              "your code, run unchanged; the query engines and retrievers its steps call run "
                              "through this executor, lowered (explain each of them to see its graph), and "
                              "a HuggingFaceEmbedding the embedder engine computes alike embeds on that engine.",
                              EXPLAIN_ROUTED, _explain_step_places(target)])
        app = self.traced(target)
        graph = self._prepare(app.graph, app.engines)
        lines = [f"TeolaExecutor plan for {type(target).__name__}", ""]
        opaque = app.opaque
        lines.append("Opaque components (run unchanged by LlamaIndex's own code):" if opaque
                     else "Opaque components: none")
        lines += [f"  - {note}" for note in opaque] + ([EXPLAIN_ROUTED] if opaque else [])
        if app.expanding:
            lines.append(EXPANDING_HEADER)
            lines += [f"  - {note}" for note in app.expanding]
        ingestion = [n for n in app.notes if n.kind == "ingestion"]
        if ingestion:
            lines.append("Document ingestion (how each index searched here stored its documents):")
            lines += [f"  - {note}" for note in ingestion]
        lines += ["", graph.explain() if self.optimize else "Optimizer: off (graph runs as traced)",
                  "", "```mermaid", graph.to_mermaid(), "```"]
        return "\n".join(lines)

    # -- running ---------------------------------------------------------------------------------
    # Each entry point runs inside LlamaIndex's own instrumentation of the method it stands
    # for (span, start / end events, callback trace: ``instrumentation.py``), as plain would.
    # A query that is neither a str nor a QueryBundle meets LlamaIndex's own checks (the start
    # event's validation, then ``query_bundle.query_str``) and, past them, LlamaIndex's own
    # ``_query`` / ``_retrieve``: the caller gets plain's exception, with Teola's note.
    def query(self, query_engine: Any, query: str | QueryBundle) -> Any:
        _require(query_engine, BaseQueryEngine, "query")
        with _noted_bad_input(query), _running(self):
            return instrumentation.instrumented(instrumentation.query, query_engine, query,
                                                lambda bundle: self._query(query_engine, bundle))

    async def aquery(self, query_engine: Any, query: str | QueryBundle) -> Any:
        _require(query_engine, BaseQueryEngine, "aquery")
        with _noted_bad_input(query), _running(self):
            return await instrumentation.ainstrumented(instrumentation.aquery, query_engine, query,
                                                       lambda bundle: self._aquery(query_engine, bundle))

    def retrieve(self, retriever: Any, query: str | QueryBundle) -> list[Any]:
        _require(retriever, BaseRetriever, "retrieve")
        with _noted_bad_input(query), _running(self):
            return instrumentation.instrumented(instrumentation.retrieve, retriever, query,
                                                lambda bundle: self._retrieve(retriever, bundle))

    async def aretrieve(self, retriever: Any, query: str | QueryBundle) -> list[Any]:
        _require(retriever, BaseRetriever, "aretrieve")
        with _noted_bad_input(query), _running(self):
            return await instrumentation.ainstrumented(instrumentation.aretrieve, retriever, query,
                                                       lambda bundle: self._aretrieve(retriever, bundle))

    def _query(self, query_engine: Any, bundle: QueryBundle) -> Any:
        if not isinstance(bundle, QueryBundle):
            with framework_passthrough():
                return query_engine._query(bundle)
        app, graph = self._plan(query_engine)
        if app.streaming_synthesis is None:
            return self._answer(app, graph, query_engine, bundle)
        # the synthesis streams after the graph: both inside the engine's own ``_query`` span
        return instrumentation.instrumented(instrumentation.own_query, query_engine, bundle,
                                            lambda bundle: self._answer(app, graph, query_engine, bundle))

    def _answer(self, app: TracedApp, graph: PGraph, query_engine: Any, bundle: QueryBundle) -> Any:
        with instrumentation.query_event(query_engine, bundle, app.root_lowered) as finish:
            query_id, started = _new_query_id(), time.monotonic()
            outputs = self._run_sync(app, graph, bundle, query_id)
            if app.streaming_synthesis is not None:
                synth, nodes = app.streaming_synthesis.synthesizer, outputs["nodes"]
                response = instrumentation.streamed(synth, bundle, nodes, lambda: self._streaming_response(
                    app.streaming_synthesis, bundle, nodes, query_id, started))
            else:
                response = outputs["response"]
            finish(response)
        return response

    async def _aquery(self, query_engine: Any, bundle: QueryBundle) -> Any:
        if not isinstance(bundle, QueryBundle):
            with framework_passthrough():
                return await query_engine._aquery(bundle)
        app, graph = await self._aplan(query_engine)
        if app.streaming_synthesis is None:
            return await self._aanswer(app, graph, query_engine, bundle)
        return await instrumentation.ainstrumented(instrumentation.own_aquery, query_engine, bundle,
                                                   lambda bundle: self._aanswer(app, graph, query_engine, bundle))

    async def _aanswer(self, app: TracedApp, graph: PGraph, query_engine: Any, bundle: QueryBundle) -> Any:
        with instrumentation.query_event(query_engine, bundle, app.root_lowered) as finish:
            query_id, started = _new_query_id(), time.monotonic()
            outputs = await self._run_async(app, graph, bundle, query_id)
            if app.streaming_synthesis is not None:
                synth, nodes = app.streaming_synthesis.synthesizer, outputs["nodes"]
                response = await instrumentation.astreamed(synth, bundle, nodes, lambda: self._streaming_response(
                    app.streaming_synthesis, bundle, nodes, query_id, started, async_=True))
            else:
                response = outputs["response"]
                if isinstance(response, StreamingResponse):  # an opaque step streamed through LlamaIndex's sync path
                    response = as_async_streaming(response)
            finish(response)
        return response

    def _retrieve(self, retriever: Any, bundle: QueryBundle) -> list[Any]:
        if not isinstance(bundle, QueryBundle):
            with framework_passthrough():
                return retriever._handle_recursive_retrieval(bundle, retriever._retrieve(bundle))
        app, graph = self._plan(retriever)
        return self._run_sync(app, graph, bundle, _new_query_id())["nodes"]

    async def _aretrieve(self, retriever: Any, bundle: QueryBundle) -> list[Any]:
        if not isinstance(bundle, QueryBundle):
            with framework_passthrough():
                return await retriever._ahandle_recursive_retrieval(bundle, await retriever._aretrieve(bundle))
        app, graph = await self._aplan(retriever)
        return (await self._run_async(app, graph, bundle, _new_query_id()))["nodes"]

    def _plan(self, target: Any) -> tuple[TracedApp, PGraph]:
        """Trace and optimize in the caller's thread (never on the runtime loop). Pending
        ingestion the graph does not take over (other indexes, opaque readers) is flushed
        first; what it takes over is claimed here, so no other path stores it twice."""
        for _ in range(3):
            app = self.traced(target)
            joined = [j for j in app.ingestions if j.engine is not None]
            if app.opaque or len(joined) != len(app.ingestions):  # may read pending nodes unseen
                flush_all()
                if not app.ingestions:
                    return app, self._prepare(app.graph, app.engines)
                continue
            _flush_read_stores(app, joined)
            for j in joined:
                j.claim = j.state.try_claim(j.batches)
            if all(j.claim is not None for j in joined):
                try:
                    return app, self._prepare(app.graph, app.engines)
                except BaseException:
                    _release_claims(app)
                    raise
            for j in joined:  # changed since the trace (another thread): store it, trace again
                if j.claim is not None:
                    j.claim.release()
            flush_all()
        flush_all()
        # Still contended: trace without joining, so the graph holds no insert without a claim
        # (pending work that arrived meanwhile is flushed by its next reader).
        app = self.traced(target, join_ingestion=False)
        return app, self._prepare(app.graph, app.engines)

    async def _aplan(self, target: Any) -> tuple[TracedApp, PGraph]:
        if not pending_states():
            return self._plan(target)
        # Flushing may block on embeddings: not on the caller's event loop. A caller cancelled
        # meanwhile never runs the plan, so its claims go back once the thread is done.
        planning = asyncio.ensure_future(asyncio.to_thread(self._plan, target))
        try:
            return await asyncio.shield(planning)
        except asyncio.CancelledError:
            planning.add_done_callback(
                lambda f: None if f.cancelled() or f.exception() else _release_claims(f.result()[0]))
            raise

    # Every claim of a plan goes back when its run ends, however it ends (Claim.release is a
    # no-op after a finished run): a run_sync interrupted before _execute started included.
    def _run_sync(self, app: TracedApp, graph: PGraph, query: QueryBundle, query_id: str) -> dict[str, Any]:
        try:
            return self.runtime.run_sync(calling_from(None, self._execute(app, graph, query, query_id, False)))
        finally:
            _release_claims(app)

    async def _run_async(self, app: TracedApp, graph: PGraph, query: QueryBundle, query_id: str) -> dict[str, Any]:
        try:
            caller = asyncio.get_running_loop()  # opaque components' async methods run there
            return await self.runtime.run_async(calling_from(caller, self._execute(app, graph, query, query_id,
                                                                                   True)))
        finally:
            _release_claims(app)

    def _left(self, started: float) -> float | None:
        """What is left of the query's ``timeout_s`` (the streamed synthesis shares its budget)."""
        if self.timeout_s is None:
            return None
        return max(_MIN_LEFT_S, self.timeout_s - (time.monotonic() - started))

    def flush(self) -> None:
        """Store every document ingestion still pending (all indexes), now; raises what fails
        (the nodes stay pending)."""
        flush_all()

    close = flush  # an executor going away leaves nothing pending; a failure raises here

    async def _execute(self, app: TracedApp, graph: PGraph, query: QueryBundle, query_id: str,
                       async_: bool) -> dict[str, Any]:
        """``async_``: the caller's call was async (LlamaIndex's spans are its async methods')."""
        claims = [j for j in app.ingestions if j.claim is not None]
        try:
            engines = await self.runtime.provide(app.engines)  # the user's own stores, served in-process
            for j in claims:
                engines[j.engine].expect(j.join_id, j.claim)
            self.last_query_id = query_id  # the latest started (for a look at its timeline)
            with failed_calls_reported():
                return await self.runtime.execute(graph, app.inputs_for(query), query_id=query_id,
                                                  timeout_s=self.timeout_s,
                                                  observer=app.spans.observer(graph, async_) if app.spans else None)
        finally:
            for j in claims:  # a failed run leaves its unstored nodes pending (retried on next access)
                engine = self.runtime.local_engines().get(j.engine)
                if engine is not None:
                    engine.forget(j.join_id, j.claim)
                j.claim.release()

    # -- chat engines: their own code (memory, condensing, prompts), their calls on Teola ----------
    # A chat engine's turn is sequential glue around calls the executor already runs: the
    # retriever / query engine (lowered graphs) and the synthesizer's LLM calls (``answer``).
    # Running the engine's own code keeps its memory exactly plain's after every turn.
    def chat(self, chat_engine: Any, message: str, chat_history: list[Any] | None = None) -> Any:
        with _chat_turn(self, chat_engine, "chat"):
            return chat_engine.chat(message, chat_history)

    async def achat(self, chat_engine: Any, message: str, chat_history: list[Any] | None = None) -> Any:
        with _chat_turn(self, chat_engine, "achat"):
            return await chat_engine.achat(message, chat_history)

    def stream_chat(self, chat_engine: Any, message: str, chat_history: list[Any] | None = None) -> Any:
        with _chat_turn(self, chat_engine, "stream_chat"):
            return chat_engine.stream_chat(message, chat_history)

    async def astream_chat(self, chat_engine: Any, message: str, chat_history: list[Any] | None = None) -> Any:
        with _chat_turn(self, chat_engine, "astream_chat"):
            return await chat_engine.astream_chat(message, chat_history)

    def _explain_chat_engine(self, engine: Any) -> str:
        lines = [f"TeolaExecutor plan for {type(engine).__name__}", "",
                 "The chat engine runs LlamaIndex's own code (memory, condensing, prompts); the calls it "
                 "makes run on Teola:"]
        parts = [(what, getattr(engine, attr, None)) for what, attr in
                 (("retrieval", "_retriever"), ("query engine", "_query_engine"))]
        parts = [(what, part) for what, part in parts if part is not None]
        for what, part in parts:
            opaque = self.traced(part).opaque
            lines.append(f"  - {what} ({type(part).__name__}): " +
                         ("lowered" if not opaque else "; ".join(str(n) for n in opaque)))
        llm = getattr(engine, "_llm", None)
        lowered, sent = False, ""  # can Teola lower its LLM's calls; where its own calls go
        if llm is not None:
            try:
                llm_call_spec(self.runtime, llm, EngineNeeds())  # asked, not run
                lowered = True
                sent = ("; sent by Teola's engine for the model, scheduled as part of the turn"
                        if isinstance(llm, LowerableLLM) or is_served_llm(llm) else "; run by the model's own code")
            except NotLowerable as exc:
                sent = f"; run by the model's own code ({exc})"
        if llm is not None and hasattr(engine, "_get_response_synthesizer"):  # answers through a synthesizer
            lines.append(f"  - the answer's LLM calls ({type(llm).__name__}): " +
                         ("lowered (the synthesizer's calls)" if lowered else f"LlamaIndex's own{sent}"))
        elif not parts:
            lines.append(f"  - the chat call (LLM.chat on the history): LlamaIndex's own call{sent}")
        if hasattr(engine, "_condense_question"):
            lines.append(f"  - the condense call (an LLM call on the history): LlamaIndex's own call{sent}")
        lines.append(EXPLAIN_ROUTED)
        for what, part in parts:
            lines += ["", self.explain(part)]
        return "\n".join(lines)

    # -- ingestion: node embeddings of a VectorStoreIndex (capture/llama_index_ingest.py) -------------
    def embed_index_nodes(self, index: Any, nodes: Sequence[Any]) -> list[Any] | None:
        """``VectorStoreIndex._get_node_with_embedding(nodes)`` with the missing embeddings
        computed by one Teola query on the engine serving ``index``'s embed model; ``None``
        when no engine serves it (the caller then runs LlamaIndex's own code)."""
        plan = self._embedding_plan(index, nodes)
        if plan is None:
            return None
        return plan.finish(self.runtime.run_sync(self._embed_texts(plan)), index._embed_model)

    async def aembed_index_nodes(self, index: Any, nodes: Sequence[Any]) -> list[Any] | None:
        plan = self._embedding_plan(index, nodes)
        if plan is None:
            return None
        return plan.finish(await self.runtime.run_async(self._embed_texts(plan)), index._embed_model)

    def _embedding_plan(self, index: Any, nodes: Sequence[Any]) -> _NodeEmbeddings | None:
        from ..capture.llama_index_models import embedder_engine_for

        engine, _ = embedder_engine_for(self.runtime, index._embed_model)
        if engine is None:
            return None
        plan = _NodeEmbeddings(list(nodes))
        if plan.texts:  # optimized here, in the caller's thread (never on the runtime loop)
            plan.graph = self._prepare(embedding_graph(engine, len(plan.texts)))
        return plan

    async def _embed_texts(self, plan: _NodeEmbeddings) -> list[Any]:
        if plan.graph is None:
            return []
        self.last_query_id = query_id = f"li-ingest-{uuid.uuid4().hex[:12]}"
        outputs = await self.runtime.execute(plan.graph, {"texts": plan.texts}, query_id=query_id,
                                             timeout_s=self.timeout_s)
        return outputs["vectors"]

    def _streaming_response(self, planner: Any, query: QueryBundle, nodes: list[Any], query_id: str,
                            started: float, async_: bool = False) -> Any:
        """LlamaIndex's (Async)StreamingResponse whose tokens come from the synthesis run, which
        starts when the stream is first read (as plain's model request does) and streams its
        final decode (graph output ``stream``) into a queue."""
        synth = planner.synthesizer
        if not nodes:  # as BaseSynthesizer: no LLM call, the empty answer as the stream
            gen = synth._empty_response_agenerator() if async_ else synth._empty_response_generator()
            return (AsyncStreamingResponse if async_ else StreamingResponse)(response_gen=gen)
        # the synthesis's own spans: its get_response ones (and a refine's events) open and close
        # before the tokens are read; its LLM call's are the token run's
        with planner.get_response_reported(query.query_str, nodes, async_) as chunks:
            graph, spans = planner.built(query, nodes, refine_chunks=chunks)
            opened_in = contextvars.copy_context() if planner.streams_in_get_response else None
        tokens = self._token_stream(graph, query_id, started, async_, observer=spans.observer(graph, async_),
                                    spans_opened_in=opened_in)
        metadata = synth._get_metadata_for_response([n.node for n in nodes])
        if async_:
            return AsyncStreamingResponse(tokens, source_nodes=list(nodes), metadata=metadata)
        return StreamingResponse(tokens, source_nodes=list(nodes), metadata=metadata)

    def _token_stream(self, graph: PGraph, query_id: str, started: float, async_: bool,
                      engines: EngineNeeds | None = None, observer: Any = None,
                      spans_opened_in: contextvars.Context | None = None) -> Any:
        """A (sync or async) generator of the tokens of ``graph``'s ``stream`` output's decode,
        which runs ``graph`` (``engines`` provided first) when it is first read: plain's
        streamed model request is sent then too, so a stream nobody reads sends nothing. The
        run gets what is left of the query's budget now. A failure of the run surfaces where
        the stream is read; a stream abandoned early stops the run. Its calls' spans nest in
        the span active where it is read, or in ``spans_opened_in``'s (a synthesizer that calls
        ``llm.stream`` in its ``get_response``: plain's spans open there)."""
        tokens: queue.Queue[Any] = queue.Queue()
        token_nodes = frozenset(ref.node for name, ref in graph.outputs.items() if name == "stream")
        self.last_query_id = query_id
        left = self._left(started)
        pace = ReadPace()  # the streamed call's events, at the pace its tokens are read here

        def submit() -> Any:
            with pace.running():
                return self.runtime.submit(self.runtime.execute(
                    graph, {}, query_id=query_id, timeout_s=left, on_token=tokens.put, token_nodes=token_nodes,
                    engines=engines, observer=observer))

        def start() -> Any:
            context = spans_opened_in if spans_opened_in is not None else contextvars.copy_context()
            future = context.run(submit)  # a Context is a mapping: an empty one is falsy
            future.add_done_callback(lambda _: tokens.put(_END))
            return future

        def token_gen() -> Iterator[str]:
            future = start()
            try:
                while (token := tokens.get()) is not _END:
                    pace.read()
                    yield token
                pace.exhausted()
                future.result()
            finally:
                pace.leave()  # no-op once exhausted
                future.cancel()  # no-op once done

        async def async_token_gen() -> AsyncIterator[str]:
            future = start()
            try:
                while (token := await asyncio.to_thread(tokens.get)) is not _END:
                    pace.read()
                    yield token
                pace.exhausted()
                await asyncio.wrap_future(future)
            finally:
                pace.leave()
                future.cancel()

        return async_token_gen() if async_ else token_gen()

    # -- call level: a synthesizer asked by code Teola runs as it is (chat engines, agents) ------
    def answer(self, synthesizer: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
        """``synthesizer.get_response(query_str, text_chunks)`` computed on Teola's engines:
        the answer text, or a token generator when the synthesizer streams; ``None`` when
        Teola does not lower it (the caller runs its own code)."""
        planned = self.answerer(synthesizer, query_str, text_chunks)
        return None if planned is None else planned.run()

    async def aanswer(self, synthesizer: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
        planned = self.aanswerer(synthesizer, query_str, text_chunks)
        return None if planned is None else await planned.run()

    def answerer(self, synthesizer: Any, query_str: str, text_chunks: Sequence[str]) -> PlannedAnswer | None:
        """:meth:`answer` in two steps: traced now (``None``: not lowered), run when called
        (the hook runs it inside the spans plain's ``get_response`` opens)."""
        return self._planned_answer(synthesizer, query_str, text_chunks, async_=False)

    def aanswerer(self, synthesizer: Any, query_str: str, text_chunks: Sequence[str]) -> PlannedAnswer | None:
        return self._planned_answer(synthesizer, query_str, text_chunks, async_=True)

    def _planned_answer(self, synthesizer: Any, query_str: str, text_chunks: Sequence[str],
                        async_: bool) -> PlannedAnswer | None:
        if not text_chunks or not isinstance(query_str, str):  # LlamaIndex's own answer and errors
            return None
        needs = EngineNeeds()
        try:
            planner = synthesis_planner(self._trace_context(), synthesizer, needs)
        except NotLowerable:
            return None
        packing = AnswerPacking(planner, query_str, list(text_chunks))

        def calls() -> tuple[Trace, Any]:
            # planned where it runs, inside plain's get_response spans: the packing's nest there
            graph, spans = planner.answer_calls(query_str, packing.texts, refine_chunks=packing.calls_go_over())
            return Trace(graph, engines=needs), spans.observer(graph, async_)

        if synthesizer._streaming:
            def stream() -> Any:  # called inside plain's get_response span (instrumentation.answered)
                answer, observer = calls()
                opened_in = contextvars.copy_context() if planner.streams_in_get_response else None
                return self._token_stream(answer.graph, _new_query_id(), time.monotonic(), async_=async_,
                                          engines=answer.engines, observer=observer, spans_opened_in=opened_in)

            if not async_:
                return PlannedAnswer(stream, packing)

            async def astream() -> Any:
                return stream()
            return PlannedAnswer(astream, packing)
        if async_:
            async def arun() -> Any:
                return await self.runtime.run_async(self._run_answer(*calls()))
            return PlannedAnswer(arun, packing)
        return PlannedAnswer(lambda: self.runtime.run_sync(self._run_answer(*calls())), packing)

    async def _run_answer(self, answer: Trace, observer: Any = None) -> Any:
        """``observer``: the LLM calls' spans (inside plain's ``get_response`` ones, around this run)."""
        self.last_query_id = query_id = _new_query_id()
        outputs = await self.runtime.execute(answer.graph, {}, query_id=query_id, timeout_s=self.timeout_s,
                                             engines=answer.engines, observer=observer)
        return outputs["out"]


class AnswerPacking:
    """The texts a synthesizer's ``get_response`` packs, packed once, when first asked (inside
    the ``get_response`` span plain packs them in): ``handed_on``, what a compacting
    synthesizer hands its parent class's ``get_response`` (None for the others); the chunks
    the calls go over (a refine's, compacted for a compact refine; a compact accumulate's
    repacked texts)."""

    def __init__(self, planner: Any, query_str: str, texts: list[str]) -> None:
        self.planner, self.query_str, self.texts = planner, query_str, texts

    @functools.cached_property
    def refine_chunks(self) -> list[str] | None:
        return self.planner.refine_chunks(self.query_str, self.texts)

    @functools.cached_property
    def handed_on(self) -> list[str] | None:
        return self.planner.handed_on(self.query_str, self.texts, self.refine_chunks)

    def calls_go_over(self) -> list[str] | None:
        return self.refine_chunks if self.refine_chunks is not None else self.handed_on


@dataclasses.dataclass(frozen=True)
class PlannedAnswer:
    """A synthesizer's ``get_response`` found lowerable for Teola's engines: ``run()`` plans its
    calls and computes it (awaitable for ``aget_response``), called inside plain's
    ``get_response`` spans; ``packing``: its texts, packed where plain packs them."""

    run: Callable[[], Any]
    packing: AnswerPacking

    @property
    def handed_on(self) -> list[str] | None:
        return self.packing.handed_on


_END = object()
_MIN_LEFT_S = 0.001  # a budget already spent still starts the run, which then times out at once


def _new_query_id() -> str:
    return f"li-{uuid.uuid4().hex[:12]}"


def as_async_streaming(response: StreamingResponse) -> AsyncStreamingResponse:
    """What ``aquery`` returns in plain LlamaIndex for a stream: the same tokens, sources and
    metadata, each token read off a framework thread (the sync generator blocks)."""
    def next_token(tokens: Iterator[str]) -> Any:
        return next(tokens, _END)

    async def tokens() -> AsyncIterator[str]:
        sync_tokens = iter(response.response_gen)
        while (token := await in_framework_thread(next_token, sync_tokens)) is not _END:
            yield token

    if response.response_gen is None:  # already read: its text
        return AsyncStreamingResponse(None, source_nodes=response.source_nodes, metadata=response.metadata,
                                      response_txt=response.response_txt)
    return AsyncStreamingResponse(tokens(), source_nodes=response.source_nodes, metadata=response.metadata)


def _flush_read_stores(app: TracedApp, joined: list[Any]) -> None:
    """Store the pending nodes of other indexes whose vector store this graph searches
    (indexes sharing a store); pending work of unrelated indexes (other users' queries)
    stays deferred for their own next query."""
    states = pending_states()
    if not states:
        return
    read = {id(need.owner) for need in app.engines.local.values()}  # the stores it searches
    mine = {id(j.state) for j in joined}
    for state in states:
        if id(state) not in mine and id(getattr(state.index, "_vector_store", None)) in read:
            state.flush()


class _NodeEmbeddings:
    """``embed_nodes`` + ``_get_node_with_embedding`` of LlamaIndex, with the texts to embed
    handed out and the vectors taken back (same texts, same id map, same node copies)."""

    def __init__(self, nodes: list[Any]) -> None:
        from llama_index.core.schema import MetadataMode

        self.graph: PGraph | None = None  # the embedding query, when something needs embedding
        self.nodes = nodes
        self.known = {n.node_id: n.embedding for n in nodes if n.embedding is not None}
        missing = [n for n in nodes if n.embedding is None]
        self.ids = [n.node_id for n in missing]
        self.texts = [n.get_content(metadata_mode=MetadataMode.EMBED) for n in missing]

    def finish(self, vectors: list[Any], embed_model: Any) -> list[Any]:
        """The node copies with their vectors; ``embed_model``'s embedding events reported as
        its ``get_text_embedding_batch`` reports them (``embed_batch_size`` texts each)."""
        if len(vectors) != len(self.texts):  # never store a node without its vector
            raise RuntimeError(f"embedder returned {len(vectors)} vectors for {len(self.texts)} nodes")
        events = EmbedEvents.of(embed_model) if self.texts else None
        if events is not None:
            events.report(self.texts, vectors, insert_batches([len(self.texts)], len(self.texts),
                                                              embed_model.embed_batch_size))
        id_to_embedding = dict(self.known)
        id_to_embedding.update(zip(self.ids, ([float(x) for x in v] for v in vectors)))
        results = []
        for node in self.nodes:
            result = node.model_copy()
            result.embedding = id_to_embedding[node.node_id]
            results.append(result)
        return results


def _release_claims(app: TracedApp) -> None:
    for j in app.ingestions:
        if j.claim is not None:
            j.claim.release()


def _explain_step_places(workflow: Any) -> str:
    """How the calls of ``workflow``'s steps are scheduled (``workflow_runs``)."""
    from .workflow_runs import steps_to_answer

    steps = workflow._get_steps()
    paths = steps_to_answer(steps)
    places = ", ".join(f"{name} {n}" for name, n in sorted(paths.items(), key=lambda kv: (-kv[1], kv[0])))
    off = sorted(set(steps) - set(paths))
    return ("  (a call a step makes shares its run's arrival and is ordered by the steps left to the answer, "
            f"a StopEvent: {places or 'none'}"
            + (f"; off the answer's path, yielding to other runs' critical calls: {', '.join(off)})" if off else ")"))


def _is_workflow(target: Any) -> bool:
    """A LlamaIndex ``Workflow`` (agents and ``AgentWorkflow`` are workflows too)."""
    try:
        from llama_index.core.workflow import Workflow
    except ImportError:  # pragma: no cover - every supported llama-index-core has it
        return False
    return isinstance(target, Workflow)


def _require(target: Any, base: type, method: str) -> None:
    if not isinstance(target, base):
        raise TypeError(f"TeolaExecutor.{method} got {type(target).__module__}.{type(target).__qualname__}; "
                        f"{method} takes a {base.__name__}. Supported: {SUPPORTED}")


@contextlib.contextmanager
def _noted_bad_input(query: Any) -> Iterator[None]:
    """Plain LlamaIndex's exception for a bad query, with Teola's note saying what is wrong."""
    try:
        yield
    except Exception as exc:
        if not isinstance(query, (str, QueryBundle)):
            exc.add_note(f"TeolaExecutor: the query was a {type(query).__name__}, not a str or QueryBundle; "
                         "LlamaIndex's own code raised this, as it would without Teola")
        elif isinstance(exc, ValueError) and str(exc).startswith("Calculated available context size"):
            text = query if isinstance(query, str) else query.query_str
            exc.add_note(f"TeolaExecutor: the query ({len(text):,} characters) and the prompt around it do not "
                         "fit the LLM's context window (LlamaIndex's PromptHelper found no room left for "
                         "context); shorten the query or use an LLM with a larger context_window")
        raise
