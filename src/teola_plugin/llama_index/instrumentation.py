"""LlamaIndex's own instrumentation around the calls the executor runs.

Plain ``BaseQueryEngine.query / aquery`` and ``BaseRetriever.retrieve / aretrieve`` open a
dispatcher span, emit ``QueryStartEvent`` / ``QueryEndEvent`` (``RetrievalStartEvent`` /
``RetrievalEndEvent``) and the callback manager's ``query`` trace (and its ``RETRIEVE``
event). The hooks replace those methods with the executor's entry points, which run
inside the functions here: the same instrumentation, with the same dispatchers and span names
(``RetrieverQueryEngine.query-<uuid>``): event, span and callback handlers (Langfuse,
Phoenix, token counters) see a query Teola ran where they see a plain one; a lowered query
engine whose own ``_query`` reports a ``QUERY`` callback event gets it too (:func:`query_event`:
``LlamaDebugHandler.get_event_pairs(CBEventType.QUERY)``). The steps that
stay opaque run LlamaIndex's own code in the caller's context (context variables flow
through the runtime loop into worker threads), so their spans nest under this one; the
lowered primitives (embed, search, LLM prefill / decode) run on the engines and emit no
LlamaIndex events of their own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from llama_index.core.base import base_query_engine, base_retriever
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.synthesis import GetResponseEndEvent, GetResponseStartEvent
from llama_index.core.instrumentation.events.synthesis import SynthesizeEndEvent, SynthesizeStartEvent
from llama_index.core.response_synthesizers import base as synthesizer_base
from llama_index.core.response_synthesizers import refine
from llama_index.core.schema import QueryBundle

from ..capture.llama_index_span_events import reports_query_event

# What the span-wrapped function below runs: set for the duration of one call. A context
# variable, not an argument, so the span's recorded arguments are LlamaIndex's own.
_RUN: contextvars.ContextVar[Callable[[QueryBundle], Any] | None] = contextvars.ContextVar(
    "teola_instrumented_run", default=None)


def _take(var: contextvars.ContextVar[Any], setters: str) -> Any:
    """What ``var`` holds for the span-wrapped function running now, cleared from the context
    before it starts: the tasks the run creates copy the context, and a long-lived one must
    not keep the run (the user's engine, its index) alive. ``setters``: who sets it."""
    value = var.get()
    if value is None:
        raise RuntimeError(f"an instrumented LlamaIndex call ran outside {setters}")
    var.set(None)
    return value


def _take_run() -> Callable[[QueryBundle], Any]:
    return _take(_RUN, "instrumented() / ainstrumented()")


def _bundle(str_or_query_bundle: Any) -> QueryBundle:
    return QueryBundle(str_or_query_bundle) if isinstance(str_or_query_bundle, str) else str_or_query_bundle


@base_query_engine.dispatcher.span
def query(self: Any, str_or_query_bundle: Any) -> Any:
    base_query_engine.dispatcher.event(QueryStartEvent(query=str_or_query_bundle))
    with self.callback_manager.as_trace("query"):
        bundle = _bundle(str_or_query_bundle)
        result = _take_run()(bundle)
    base_query_engine.dispatcher.event(QueryEndEvent(query=bundle, response=result))
    return result


@base_query_engine.dispatcher.span
async def aquery(self: Any, str_or_query_bundle: Any) -> Any:
    base_query_engine.dispatcher.event(QueryStartEvent(query=str_or_query_bundle))
    with self.callback_manager.as_trace("query"):
        bundle = _bundle(str_or_query_bundle)
        result = await _take_run()(bundle)
    base_query_engine.dispatcher.event(QueryEndEvent(query=bundle, response=result))
    return result


# A lowered engine's own ``_query`` span, where the executor's work outlives the graph run (a
# synthesis that streams after it): around both, as plain's ``_query`` is.
@base_query_engine.dispatcher.span
def _query(self: Any, query_bundle: Any) -> Any:
    return _take_run()(query_bundle)


@base_query_engine.dispatcher.span
async def _aquery(self: Any, query_bundle: Any) -> Any:
    return await _take_run()(query_bundle)


own_query, own_aquery = _query, _aquery


@base_retriever.dispatcher.span
def retrieve(self: Any, str_or_query_bundle: Any) -> Any:
    self._check_callback_manager()
    base_retriever.dispatcher.event(RetrievalStartEvent(str_or_query_bundle=str_or_query_bundle))
    bundle = _bundle(str_or_query_bundle)
    with self.callback_manager.as_trace("query"):
        with self.callback_manager.event(CBEventType.RETRIEVE,
                                         payload={EventPayload.QUERY_STR: bundle.query_str}) as event:
            nodes = _take_run()(bundle)
            event.on_end(payload={EventPayload.NODES: nodes})
    base_retriever.dispatcher.event(RetrievalEndEvent(str_or_query_bundle=str_or_query_bundle, nodes=nodes))
    return nodes


@base_retriever.dispatcher.span
async def aretrieve(self: Any, str_or_query_bundle: Any) -> Any:
    self._check_callback_manager()
    base_retriever.dispatcher.event(RetrievalStartEvent(str_or_query_bundle=str_or_query_bundle))
    bundle = _bundle(str_or_query_bundle)
    with self.callback_manager.as_trace("query"):
        with self.callback_manager.event(CBEventType.RETRIEVE,
                                         payload={EventPayload.QUERY_STR: bundle.query_str}) as event:
            nodes = await _take_run()(bundle)
            event.on_end(payload={EventPayload.NODES: nodes})
    base_retriever.dispatcher.event(RetrievalEndEvent(str_or_query_bundle=str_or_query_bundle, nodes=nodes))
    return nodes


def instrumented(method: Any, target: Any, str_or_query_bundle: Any, run: Callable[[QueryBundle], Any]) -> Any:
    """Call ``method`` (one of the four above) as ``target``'s own method, running ``run``
    inside LlamaIndex's instrumentation. Bound like a method, so the span is named after
    ``target``'s class, as plain LlamaIndex names it."""
    token = _RUN.set(run)
    try:
        return method.__get__(target, type(target))(str_or_query_bundle)
    finally:
        _RUN.reset(token)


async def ainstrumented(method: Any, target: Any, str_or_query_bundle: Any,
                        run: Callable[[QueryBundle], Awaitable[Any]]) -> Any:
    token = _RUN.set(run)
    try:
        return await method.__get__(target, type(target))(str_or_query_bundle)
    finally:
        _RUN.reset(token)


@contextlib.contextmanager
def query_event(engine: Any, bundle: QueryBundle, lowered: bool) -> Iterator[Callable[[Any], None]]:
    """The callback ``QUERY`` event ``engine``'s own ``_query`` opens, around a lowered run of
    it (an engine running its own code reports its own); yields ``finish(response)``, which
    ends it with the response as plain does. An exception is reported as plain's is."""
    if not lowered or not reports_query_event(engine):
        yield lambda response: None
        return
    with engine.callback_manager.event(CBEventType.QUERY, payload={EventPayload.QUERY_STR: bundle.query_str}) as event:
        yield lambda response: event.on_end(payload={EventPayload.RESPONSE: response})


# -- a synthesizer's get_response the executor answers ----------------------------------------
# Plain ``get_response`` is a span named after the synthesizer's class (a refine's also its
# ``GetResponseStartEvent`` / ``GetResponseEndEvent`` over the chunks it refines); a compact
# refine or accumulate opens two, its own around its parent's over what it compacted. The executor's
# answer (``TeolaExecutor.answerer``: its run and those chunks, compacted once) runs inside
# the same.
_ANSWER: contextvars.ContextVar[Any] = contextvars.ContextVar("teola_answer", default=None)


def _take_answer() -> Any:
    return _take(_ANSWER, "answered() / aanswered()")


def _refines(synthesizer: Any) -> bool:
    from llama_index.core.response_synthesizers import Refine

    return isinstance(synthesizer, Refine)


def _compacts(synthesizer: Any) -> bool:
    """Does its ``get_response`` hand its texts on to its parent class's (a second span)?"""
    from llama_index.core.response_synthesizers import CompactAndRefine
    from llama_index.core.response_synthesizers.compact_and_accumulate import CompactAndAccumulate

    return isinstance(synthesizer, (CompactAndRefine, CompactAndAccumulate))


@refine.dispatcher.span
def get_response(self: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
    planned = _take_answer()
    if not _refines(self):
        return planned.run()
    refine.dispatcher.event(GetResponseStartEvent(query_str=query_str, text_chunks=list(text_chunks)))
    result = planned.run()
    refine.dispatcher.event(GetResponseEndEvent())
    return result


@refine.dispatcher.span
async def aget_response(self: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
    planned = _take_answer()
    if not _refines(self):
        return await planned.run()
    refine.dispatcher.event(GetResponseStartEvent(query_str=query_str, text_chunks=list(text_chunks)))
    result = await planned.run()
    refine.dispatcher.event(GetResponseEndEvent())
    return result


def _compact_get_response(self: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
    return get_response.__get__(self, type(self))(query_str, _ANSWER.get().handed_on)


async def _compact_aget_response(self: Any, query_str: str, text_chunks: Sequence[str]) -> Any:
    return await aget_response.__get__(self, type(self))(query_str, _ANSWER.get().handed_on)


_compact_get_response.__name__, _compact_aget_response.__name__ = "get_response", "aget_response"
_compact_get_response = refine.dispatcher.span(_compact_get_response)
_compact_aget_response = refine.dispatcher.span(_compact_aget_response)


def answered(synthesizer: Any, query_str: str, text_chunks: Sequence[str], planned: Any) -> Any:
    """``planned.run()`` (the executor's ``synthesizer.get_response(query_str, text_chunks)``,
    a ``PlannedAnswer``) inside the spans and events plain's ``get_response`` opens."""
    token = _ANSWER.set(planned)
    try:
        method = _compact_get_response if _compacts(synthesizer) else get_response
        return method.__get__(synthesizer, type(synthesizer))(query_str, text_chunks)
    finally:
        _ANSWER.reset(token)


async def aanswered(synthesizer: Any, query_str: str, text_chunks: Sequence[str], planned: Any) -> Any:
    token = _ANSWER.set(planned)
    try:
        method = _compact_aget_response if _compacts(synthesizer) else aget_response
        return await method.__get__(synthesizer, type(synthesizer))(query_str, text_chunks)
    finally:
        _ANSWER.reset(token)


# -- a streaming synthesis the executor builds after the graph ----------------------------------
# A lowered query's streaming synthesizer runs after its graph (which returned the nodes): the
# executor builds the StreamingResponse itself, inside the ``synthesize`` span plain opens
# (``asynthesize`` for ``aquery``) with its events and ``SYNTHESIZE`` callback event, which
# end when the response is returned, before its tokens are read, as plain's do.
_SYNTHESIS: contextvars.ContextVar[Callable[[], Any] | None] = contextvars.ContextVar("teola_synthesis", default=None)


def _synthesize_as_plain(self: Any, query: Any, nodes: Sequence[Any]) -> Any:
    run = _take(_SYNTHESIS, "streamed()")
    synthesizer_base.dispatcher.event(SynthesizeStartEvent(query=query))
    if not nodes:  # no LLM call and no callback event: the empty answer
        response = run()
    else:
        bundle = _bundle(query)
        with self._callback_manager.event(CBEventType.SYNTHESIZE,
                                          payload={EventPayload.QUERY_STR: bundle.query_str}) as event:
            response = run()
            event.on_end(payload={EventPayload.RESPONSE: response})
    synthesizer_base.dispatcher.event(SynthesizeEndEvent(query=query, response=response))
    return response


@synthesizer_base.dispatcher.span
def synthesize(self: Any, query: Any, nodes: Sequence[Any], additional_source_nodes: Any = None,
               **response_kwargs: Any) -> Any:
    return _synthesize_as_plain(self, query, nodes)


@synthesizer_base.dispatcher.span
async def asynthesize(self: Any, query: Any, nodes: Sequence[Any], additional_source_nodes: Any = None,
                      **response_kwargs: Any) -> Any:
    return _synthesize_as_plain(self, query, nodes)


def streamed(synthesizer: Any, query: Any, nodes: Sequence[Any], run: Callable[[], Any]) -> Any:
    """``run()`` (the executor's streaming response) inside plain's ``synthesize`` span and events."""
    token = _SYNTHESIS.set(run)
    try:
        return synthesize.__get__(synthesizer, type(synthesizer))(query, nodes)
    finally:
        _SYNTHESIS.reset(token)


async def astreamed(synthesizer: Any, query: Any, nodes: Sequence[Any], run: Callable[[], Any]) -> Any:
    token = _SYNTHESIS.set(run)
    try:
        return await asynthesize.__get__(synthesizer, type(synthesizer))(query, nodes)
    finally:
        _SYNTHESIS.reset(token)
