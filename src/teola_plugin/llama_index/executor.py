"""``TeolaExecutor``: trace a LlamaIndex query engine or retriever, optimize, run on the runtime.

    Settings.executor = TeolaExecutor()          # drop-in: query / retrieve now run on Teola
    executor.query(query_engine, "question")     # or explicitly
    print(executor.explain(query_engine))        # passes applied, graph, what stayed opaque

Each call traces the object as it is now (so a changed ``similarity_top_k`` is honoured),
optimizes the graph and runs it as one query; the result is the framework's own type
(``Response`` with ``source_nodes``, or a ``NodeWithScore`` list). No optimizer or scheduler
logic lives here.
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import QueryBundle

from ..capture.llama_index import SUPPORTED, TraceContext, TracedApp, trace
from ..errors import ConfigError
from ..ir.graph import PGraph
from ..optimizer.manager import PassManager
from ..runtime.runtime import Runtime, default_runtime


class TeolaExecutor:
    """Runs LlamaIndex query engines and retrievers on a Teola :class:`Runtime`.

    Args:
        runtime: where engines live; ``None`` = the process-wide ``default_runtime()``
            (embedded Ray and the default engines), shared with TeolaLLM / TeolaEmbedding.
        passes / disabled: optimizer passes to run / to switch off (names checked here).
        optimize: ``False`` runs the traced graph as traced (module order).
        timeout_s: bound on each query (``QueryTimeoutError``), ``None`` for none.
    """

    def __init__(self, runtime: Runtime | None = None, *, passes: Sequence[str] | None = None,
                 disabled: Iterable[str] = (), optimize: bool = True, timeout_s: float | None = None) -> None:
        if runtime is not None and not isinstance(runtime, Runtime):
            raise ConfigError(f"runtime must be a teola_plugin Runtime or None, got {type(runtime).__name__}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or timeout_s <= 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        self._passes = PassManager(passes, disabled)  # unknown names fail here, not mid-query
        self.optimize = bool(optimize)
        self.timeout_s = timeout_s
        self._runtime = runtime
        self._context: TraceContext | None = None
        self.last_query_id: str | None = None  # for the runtime timeline of the latest run

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
            self._context = TraceContext(self.runtime, prepare_expansion=self._prepare)
        return self._context

    def _prepare(self, graph: PGraph) -> PGraph:
        return self._passes.run(graph) if self.optimize else graph

    def traced(self, target: Any) -> TracedApp:
        """The trace with its bookkeeping (bound inputs, local engines, notes)."""
        return trace(target, self._trace_context())

    def trace(self, target: Any) -> PGraph:
        """The primitive graph of ``target`` as traced (module order, before optimization)."""
        return self.traced(target).graph

    def explain(self, target: Any) -> str:
        """Passes applied, the optimized graph as mermaid, and which components stayed opaque."""
        app = self.traced(target)
        graph = self._prepare(app.graph)
        lines = [f"TeolaExecutor plan for {type(target).__name__}", ""]
        opaque = app.opaque
        lines.append("Opaque components (run unchanged by LlamaIndex's own code):" if opaque
                     else "Opaque components: none")
        lines += [f"  - {note}" for note in opaque]
        expanding = [n for n in app.notes if n.kind == "expands"]
        if expanding:
            lines.append("Data-dependent steps (sub-graph built at run time, optimized the same way):")
            lines += [f"  - {note}" for note in expanding]
        lines += ["", graph.explain() if self.optimize else "Optimizer: off (graph runs as traced)",
                  "", "```mermaid", graph.to_mermaid(), "```"]
        return "\n".join(lines)

    # -- running ---------------------------------------------------------------------------------
    def query(self, query_engine: Any, query: str | QueryBundle) -> Any:
        _require(query_engine, BaseQueryEngine, "query")
        return self.runtime.run_sync(self._execute(query_engine, _query_bundle(query)))["response"]

    async def aquery(self, query_engine: Any, query: str | QueryBundle) -> Any:
        _require(query_engine, BaseQueryEngine, "aquery")
        return (await self.runtime.run_async(self._execute(query_engine, _query_bundle(query))))["response"]

    def retrieve(self, retriever: Any, query: str | QueryBundle) -> list[Any]:
        _require(retriever, BaseRetriever, "retrieve")
        return self.runtime.run_sync(self._execute(retriever, _query_bundle(query)))["nodes"]

    async def aretrieve(self, retriever: Any, query: str | QueryBundle) -> list[Any]:
        _require(retriever, BaseRetriever, "aretrieve")
        return (await self.runtime.run_async(self._execute(retriever, _query_bundle(query))))["nodes"]

    def _execute(self, target: Any, query: QueryBundle) -> Coroutine[Any, Any, dict[str, Any]]:
        """Trace and optimize here, in the caller's thread; the coroutine runs on the runtime loop."""
        app = self.traced(target)
        graph = self._prepare(app.graph)
        self.last_query_id = query_id = f"li-{uuid.uuid4().hex[:12]}"

        async def run() -> dict[str, Any]:
            for name, engine in app.local_engines.items():  # the user's own stores, served in-process
                await self.runtime.add_local_engine(name, engine)
            return await self.runtime.execute(graph, app.inputs_for(query), query_id=query_id,
                                              timeout_s=self.timeout_s)

        return run()


def _require(target: Any, base: type, method: str) -> None:
    if not isinstance(target, base):
        raise TypeError(f"TeolaExecutor.{method} got {type(target).__module__}.{type(target).__qualname__}; "
                        f"{method} takes a {base.__name__}. Supported: {SUPPORTED}")


def _query_bundle(query: str | QueryBundle) -> QueryBundle:
    if isinstance(query, str):
        return QueryBundle(query)
    if isinstance(query, QueryBundle):
        return query
    raise TypeError(f"query must be a str or a llama_index QueryBundle, got {type(query).__name__}")
