"""The events plain LlamaIndex fires inside the spans a lowered query reports
(``llama_index_spans.py``): each is one span's ``start(values) -> state``,
``end(state, result, values)`` and ``failed(state, exc)``, firing what the method fires, in its order
(the dispatcher's start / end events, the callback manager's event with its payloads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base import base_query_engine, base_retriever
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.events.query import QueryEndEvent, QueryStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.events.synthesis import (GetResponseEndEvent, GetResponseStartEvent,
                                                               SynthesizeEndEvent, SynthesizeStartEvent)
from llama_index.core.response_synthesizers import base as synthesizer_base
from llama_index.core.response_synthesizers import refine

from ..ir.node import Ref


@dataclass(frozen=True)
class CallbackEvent:
    """A callback manager's event opened at a span's start (``manager.event``'s payloads)."""

    manager: Any
    event_type: CBEventType

    def start(self, payload: dict[str, Any]) -> str | None:
        if not self.manager.handlers:
            return None
        return self.manager.on_event_start(self.event_type, payload=payload)

    def end(self, event_id: str | None, payload: dict[str, Any] | None) -> None:
        if event_id is not None:
            self.manager.on_event_end(self.event_type, payload=payload, event_id=event_id)

    def failed(self, event_id: str | None, exc: BaseException) -> None:
        self.end(event_id, failure_payload(exc))


def failure_payload(exc: BaseException) -> dict[str, Any] | None:
    """``CallbackManager.event``'s end payload for a failure: the exception for the innermost
    event it passes (which marks it ``event_added``), none for the events around that one, nor
    for a cancellation (not an ``Exception``: only its ``finally`` ends the event)."""
    if hasattr(exc, "event_added") or not isinstance(exc, Exception):
        return None
    exc.event_added = True  # type: ignore[attr-defined]
    return {EventPayload.EXCEPTION: exc}


@dataclass(frozen=True)
class ComponentEvents:
    """A component method's events: the dispatcher's start event (of the query), the component's
    callback event (query string -> the method's result under ``result_key``), the end event
    (``dispatcher`` None: the callback event alone)."""

    component: Any
    query: Ref
    dispatcher: Any
    event_type: CBEventType
    result_key: EventPayload
    start_event: Callable[[Any], Any] | None = None  # query -> event
    end_event: Callable[[Any, Any], Any] | None = None  # query, result -> event
    # whether the method opens its callback event on this run (None: always)
    opens_callback: Callable[[Callable[[Ref], Any]], bool] | None = None

    def start(self, values: Callable[[Ref], Any]) -> Any:
        query = values(self.query)
        if self.dispatcher is not None:
            self.dispatcher.event(self.start_event(query))
        if self.opens_callback is not None and not self.opens_callback(values):
            return None
        return self._callback().start({EventPayload.QUERY_STR: query.query_str})

    def end(self, event_id: Any, result: Any, values: Callable[[Ref], Any]) -> None:
        self._callback().end(event_id, {self.result_key: result})
        if self.dispatcher is not None:
            self.dispatcher.event(self.end_event(values(self.query), result))

    def failed(self, event_id: Any, exc: BaseException) -> None:
        self._callback().failed(event_id, exc)

    def _callback(self) -> CallbackEvent:
        return CallbackEvent(self.component.callback_manager, self.event_type)


def retrieve_events(retriever: Any, query: Ref) -> ComponentEvents:
    """``BaseRetriever.retrieve``'s: ``RetrievalStartEvent``, ``RETRIEVE`` (-> nodes), ``RetrievalEndEvent``."""
    return ComponentEvents(retriever, query, base_retriever.dispatcher, CBEventType.RETRIEVE, EventPayload.NODES,
                           lambda q: RetrievalStartEvent(str_or_query_bundle=q),
                           lambda q, nodes: RetrievalEndEvent(str_or_query_bundle=q, nodes=nodes))


def callback_event(component: Any, query: Ref, event_type: CBEventType, result_key: EventPayload) -> ComponentEvents:
    """A callback event ``component``'s own code opens around part of its work (query string ->
    its result), with no span or dispatcher event of its own."""
    return ComponentEvents(component, query, None, event_type, result_key)


def synthesize_events(synthesizer: Any, query: Ref, nodes: Callable[[Callable[[Ref], Any]], Any]) -> ComponentEvents:
    """``BaseSynthesizer.synthesize``'s: ``SynthesizeStartEvent``, ``SYNTHESIZE`` (-> response),
    ``SynthesizeEndEvent``; with no ``nodes`` (the run's nodes from its values) it answers
    before it opens ``SYNTHESIZE``, so only the two dispatcher events fire."""
    def has_nodes(values: Callable[[Ref], Any]) -> bool:
        given = nodes(values)
        return given is None or len(given) > 0  # not known yet: as if some

    return ComponentEvents(synthesizer, query, synthesizer_base.dispatcher, CBEventType.SYNTHESIZE,
                           EventPayload.RESPONSE, lambda q: SynthesizeStartEvent(query=q),
                           lambda q, response: SynthesizeEndEvent(query=q, response=response), has_nodes)


def reports_query_event(engine: Any) -> bool:
    """Does ``engine``'s own ``_query`` / ``_aquery`` wrap its work in a ``QUERY`` callback
    event (LlamaIndex's own engines that Teola lowers, by their source)?"""
    from llama_index.core.query_engine import (CitationQueryEngine, RetrieverQueryEngine, RouterQueryEngine,
                                               SubQuestionQueryEngine)

    return type(engine) in (RetrieverQueryEngine, CitationQueryEngine, SubQuestionQueryEngine, RouterQueryEngine)


@dataclass(frozen=True)
class QueryEvents:
    """``BaseQueryEngine.query`` of a query engine run inside another's lowered graph (the
    executor's entry point reports the outermost one itself): ``QueryStartEvent`` /
    ``QueryEndEvent``, and with ``engine`` (one whose ``_query`` reports it) its ``QUERY``
    callback event."""

    query: Ref
    engine: Any = None

    def start(self, values: Callable[[Ref], Any]) -> Any:
        query = values(self.query)
        base_query_engine.dispatcher.event(QueryStartEvent(query=query))
        if self.engine is None or not reports_query_event(self.engine):
            return None
        return self._callback().start({EventPayload.QUERY_STR: query.query_str})

    def end(self, event_id: Any, response: Any, values: Callable[[Ref], Any]) -> None:
        if self.engine is not None:
            self._callback().end(event_id, {EventPayload.RESPONSE: response})
        base_query_engine.dispatcher.event(QueryEndEvent(query=values(self.query), response=response))

    def failed(self, event_id: Any, exc: BaseException) -> None:
        if self.engine is not None:
            self._callback().failed(event_id, exc)

    def _callback(self) -> CallbackEvent:
        return CallbackEvent(self.engine.callback_manager, CBEventType.QUERY)


@dataclass(frozen=True)
class GetResponseEvents:
    """``Refine.get_response``: ``GetResponseStartEvent`` over the chunks it refines, then
    ``GetResponseEndEvent``."""

    query_str: str
    text_chunks: Sequence[str]

    def start(self, values: Callable[[Ref], Any]) -> Any:
        refine.dispatcher.event(GetResponseStartEvent(query_str=self.query_str, text_chunks=list(self.text_chunks)))

    def end(self, state: Any, result: Any, values: Callable[[Ref], Any]) -> None:
        refine.dispatcher.event(GetResponseEndEvent())

    def failed(self, state: Any, exc: BaseException) -> None:
        pass
