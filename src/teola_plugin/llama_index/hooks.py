"""The ``Settings.executor`` hook: LlamaIndex's query / retrieve entry points, routed.

LlamaIndex has no executor setting; ``Settings`` is a plain object, so ``Settings.executor =
TeolaExecutor()`` only stores the executor. :func:`install` wraps four methods once —
``BaseQueryEngine.query`` / ``aquery`` and ``BaseRetriever.retrieve`` / ``aretrieve`` — so each
call checks the setting: a TeolaExecutor runs it, anything else (``None``) runs the original.
The LLM synthesizers' ``get_response`` / ``aget_response`` are wrapped too, so a
``synthesize`` called by code that runs as it is (a chat engine) has its LLM calls planned
and run by the executor. It also wraps ``VectorStoreIndex._(a)get_node_with_embedding``
(the embedding step of ``from_documents`` / ``insert`` / ``insert_nodes``), which the
executor computes on its embedder engine when that engine serves the index's embed model.
Deferred ingestion's hooks (record nodes, flush before reads) are in ``ingest_hooks``; the
query / retrieve wrappers here flush pending ingestion first when no executor runs the call.
Calls the executor itself makes into the framework run the originals: the lowering's glue
(``capture.llama_index.framework_passthrough``) and an opaque component's calls on itself
(``running_own_code``); the query engines and retrievers an opaque component calls in turn
(a custom engine's retriever, a synthesizer it calls) are run by the executor, lowered.
Subclasses that override these methods keep their own code.

Calls to a model server made by code that runs as it is (a workflow's or agent's steps, a
chat engine, a component Teola does not lower) go through the executor's served engines:
``served_calls`` routes the ``openai`` SDK's requests while an executor runs the call or is
``Settings.executor``. A call made from a workflow step is scheduled at its step's position
in the run (``workflow_runs``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.indices.vector_store.base import VectorStoreIndex
from llama_index.core.settings import Settings

from .. import served_calls
from ..capture.llama_index import in_passthrough
from ..capture.llama_index_synthesis import LLM_SYNTHESIZERS
from ..runtime import app_runs
from . import ingest_hooks, instrumentation, workflow_runs
from .executor import TeolaExecutor, running_executor
from .pending_ingestion import flush_all, pending_states

_ORIGINAL = "__teola_original__"


def active_executor(component: Any = None) -> TeolaExecutor | None:
    """The executor that should run a framework call on ``component`` made now, if any."""
    if in_passthrough(component):
        return None
    executor = getattr(Settings, "executor", None)
    return executor if isinstance(executor, TeolaExecutor) else running_executor()


def _served_call_scope() -> served_calls.ServedCallScope | None:
    """Model-server calls go through the engines of the executor running now, or of
    ``Settings.executor`` (the LlamaIndex fallback of ``served_calls``)."""
    executor = running_executor() or getattr(Settings, "executor", None)
    if not isinstance(executor, TeolaExecutor) or executor.runtime.closed:
        return None
    return served_calls.ServedCallScope(executor.runtime, app_runs.call_priority())


def _bound(original: Any, obj: Any) -> Any:
    """``original`` bound to ``obj`` as its method: LlamaIndex's span decorator names the span
    after the bound instance's class (``RetrieverQueryEngine.query``), not the defining one."""
    return original.__get__(obj, type(obj))


def _route_sync(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def routed(self: Any, str_or_query_bundle: Any) -> Any:
        executor = active_executor(self)
        if executor is None:
            flush_all()  # documents acknowledged to the caller are read like plain LlamaIndex's
            return _bound(original, self)(str_or_query_bundle)
        return run(executor, self, str_or_query_bundle)

    setattr(routed, _ORIGINAL, original)
    return routed


def _route_async(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def routed(self: Any, str_or_query_bundle: Any) -> Any:
        executor = active_executor(self)
        if executor is None:
            if pending_states():
                await asyncio.to_thread(flush_all)
            return await _bound(original, self)(str_or_query_bundle)
        return await run(executor, self, str_or_query_bundle)

    setattr(routed, _ORIGINAL, original)
    return routed


def _route_embeddings(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    """``VectorStoreIndex._get_node_with_embedding``: the executor's engines when one serves
    the index's embed model, else the original."""
    @functools.wraps(original)
    def routed(self: Any, nodes: Any, show_progress: bool = False) -> Any:
        executor = active_executor()
        embedded = None if executor is None else run(executor, self, nodes, show_progress)
        return _bound(original, self)(nodes, show_progress) if embedded is None else embedded

    setattr(routed, _ORIGINAL, original)
    return routed


def _route_embeddings_async(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def routed(self: Any, nodes: Any, show_progress: bool = False) -> Any:
        executor = active_executor()
        embedded = None if executor is None else await run(executor, self, nodes, show_progress)
        return await _bound(original, self)(nodes, show_progress) if embedded is None else embedded

    setattr(routed, _ORIGINAL, original)
    return routed


def _route_answer(cls: type) -> Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]:
    """``get_response`` of one synthesizer class (its exact instances): the LLM calls of a
    ``synthesize`` made by code that runs as it is (a chat engine, an agent's tool, user code)
    go to the executor; ``synthesize`` itself (events, empty input, sources) stays plain's."""
    def wrap(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def routed(self: Any, query_str: Any, text_chunks: Any, **response_kwargs: Any) -> Any:
            executor = None if type(self) is not cls or response_kwargs else active_executor(self)
            planned = None if executor is None else run(executor, self, query_str, text_chunks)
            if planned is None:
                return _bound(original, self)(query_str, text_chunks, **response_kwargs)
            return instrumentation.answered(self, query_str, text_chunks, planned)

        setattr(routed, _ORIGINAL, original)
        return routed

    return wrap


def _route_answer_async(cls: type) -> Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def routed(self: Any, query_str: Any, text_chunks: Any, **response_kwargs: Any) -> Any:
            executor = None if type(self) is not cls or response_kwargs else active_executor(self)
            planned = None if executor is None else run(executor, self, query_str, text_chunks)
            if planned is None:
                return await _bound(original, self)(query_str, text_chunks, **response_kwargs)
            return await instrumentation.aanswered(self, query_str, text_chunks, planned)

        setattr(routed, _ORIGINAL, original)
        return routed

    return wrap


# The executor's entry points run inside LlamaIndex's own instrumentation (span, query /
# retrieval events, callback trace), as the methods they replace would.
_ROUTES: tuple[tuple[type, str, Callable[..., Callable[..., Any]], Callable[..., Any]], ...] = (
    (BaseQueryEngine, "query", _route_sync, TeolaExecutor.query),
    (BaseQueryEngine, "aquery", _route_async, TeolaExecutor.aquery),
    (BaseRetriever, "retrieve", _route_sync, TeolaExecutor.retrieve),
    (BaseRetriever, "aretrieve", _route_async, TeolaExecutor.aretrieve),
    (VectorStoreIndex, "_get_node_with_embedding", _route_embeddings, ingest_hooks.embed_index_nodes),
    (VectorStoreIndex, "_aget_node_with_embedding", _route_embeddings_async, ingest_hooks.aembed_index_nodes),
    *((cls, "get_response", _route_answer(cls), TeolaExecutor.answerer) for cls in LLM_SYNTHESIZERS),
    *((cls, "aget_response", _route_answer_async(cls), TeolaExecutor.aanswerer) for cls in LLM_SYNTHESIZERS),
)


def install() -> None:
    """Wrap the entry points (idempotent: a wrapped method is left as it is)."""
    for cls, name, wrap, run in _ROUTES:
        method = cls.__dict__[name]
        if not hasattr(method, _ORIGINAL):
            setattr(cls, name, wrap(method, run))
    ingest_hooks.install()
    served_calls.install()
    served_calls.set_fallback(_served_call_scope)
    app_runs.add_provider(workflow_runs.position)


def uninstall() -> None:
    """Restore the original methods (``Settings.executor = None`` is enough for most uses);
    pending ingestion is stored first."""
    ingest_hooks.uninstall()
    for cls, name, _, _ in _ROUTES:
        original = getattr(cls.__dict__[name], _ORIGINAL, None)
        if original is not None:
            setattr(cls, name, original)
