"""The events plain LlamaIndex fires inside the spans a lowered query reports
(``llama_index_spans.py``): each class is one span's ``start(values) -> state``,
``end(state, result)`` and ``failed(state, exc)``, firing what the method fires, in its order
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

    def end(self, event_id: str | None, payload: dict[str, Any]) -> None:
        if event_id is not None:
            self.manager.on_event_end(self.event_type, payload=payload, event_id=event_id)


@dataclass(frozen=True)
class RetrieveEvents:
    """``BaseRetriever.retrieve``: ``RetrievalStartEvent``, the ``RETRIEVE`` callback event
    (query string -> nodes), ``RetrievalEndEvent``."""

    retriever: Any
    query: Ref

    def start(self, values: Callable[[Ref], Any]) -> Any:
        query = values(self.query)
        base_retriever.dispatcher.event(RetrievalStartEvent(str_or_query_bundle=query))
        return self._callback().start({EventPayload.QUERY_STR: query.query_str})

    def end(self, event_id: Any, nodes: Any, values: Callable[[Ref], Any]) -> None:
        self._callback().end(event_id, {EventPayload.NODES: nodes})
        base_retriever.dispatcher.event(RetrievalEndEvent(str_or_query_bundle=values(self.query), nodes=nodes))

    def failed(self, event_id: Any, exc: BaseException) -> None:
        self._callback().end(event_id, {EventPayload.EXCEPTION: exc})

    def _callback(self) -> CallbackEvent:
        return CallbackEvent(self.retriever.callback_manager, CBEventType.RETRIEVE)


@dataclass(frozen=True)
class QueryEvents:
    """``BaseQueryEngine.query`` of a query engine run inside another's lowered graph (the
    executor's entry point reports the outermost one itself)."""

    query: Ref

    def start(self, values: Callable[[Ref], Any]) -> Any:
        base_query_engine.dispatcher.event(QueryStartEvent(query=values(self.query)))

    def end(self, state: Any, response: Any, values: Callable[[Ref], Any]) -> None:
        base_query_engine.dispatcher.event(QueryEndEvent(query=values(self.query), response=response))

    def failed(self, state: Any, exc: BaseException) -> None:
        pass


@dataclass(frozen=True)
class SynthesizeEvents:
    """``BaseSynthesizer.synthesize``: ``SynthesizeStartEvent``, the ``SYNTHESIZE`` callback
    event (query string -> response), ``SynthesizeEndEvent``."""

    synthesizer: Any
    query: Ref

    def start(self, values: Callable[[Ref], Any]) -> Any:
        query = values(self.query)
        synthesizer_base.dispatcher.event(SynthesizeStartEvent(query=query))
        return self._callback().start({EventPayload.QUERY_STR: query.query_str})

    def end(self, event_id: Any, response: Any, values: Callable[[Ref], Any]) -> None:
        self._callback().end(event_id, {EventPayload.RESPONSE: response})
        synthesizer_base.dispatcher.event(SynthesizeEndEvent(query=values(self.query), response=response))

    def failed(self, event_id: Any, exc: BaseException) -> None:
        self._callback().end(event_id, {EventPayload.EXCEPTION: exc})

    def _callback(self) -> CallbackEvent:
        return CallbackEvent(self.synthesizer.callback_manager, CBEventType.SYNTHESIZE)


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
