"""LlamaIndex's own LLM events for a lowered ``llm.predict``, as the LLM would fire them.

A lowered call never runs ``LLM.chat`` / ``complete``, whose decorators
(``llama_index.core.llms.callbacks``) report it: the callback manager's ``LLM`` event (what
``TokenCountingHandler`` counts and ``LlamaDebugHandler`` lists) and the dispatcher's
``LLMChatStartEvent`` / ``LLMChatEndEvent`` (``LLMCompletion...`` for a completion model),
which instrumentation handlers (Langfuse, Phoenix) read, inside ``predict``'s own
``LLMPredictStartEvent`` / ``LLMPredictEndEvent`` and its ``TEMPLATING`` callback event. Two
CPU steps stand in: ``llm_start`` beside the prefill (the messages or prompt ``predict``
builds, by the LLM's own ``_get_messages`` / ``_get_prompt``) and ``llm_end`` after the
decode (the response with the server's reply as ``raw`` and its token counts, so usage-based
counters count what plain counts). They are added only when someone listens (a callback handler on the LLM's manager,
an event handler on the dispatcher chain). A streamed call reports as ``LLM.stream``'s does:
``llm_start`` is the decode's listener (its request is sent after the start events), an
``LLMChatInProgressEvent`` / ``LLMCompletionInProgressEvent`` per chunk the server sends (the
text so far, the chunk's delta, the chunk as ``raw``), in order; the end reports the last
chunk's response (its delta) and no ``LLMPredictEndEvent``. Where the call's tokens stream to a
caller (a synthesizer's ``response_gen``: :class:`ReadPace`), these are paced by the caller's
reading, as plain's generator fires them: a chunk's event just before its token is handed on
(so a chat engine's delta event follows it), the end once the caller reads past the last
token, and a caller that stops reading early gets plain's ``GeneratorExit`` failure instead.
Otherwise they are reported off the runtime loop as the chunks arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.events.exception import ExceptionEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMCompletionInProgressEvent,
    LLMCompletionStartEvent,
    LLMPredictEndEvent,
    LLMPredictStartEvent,
)
from llama_index.core.llms import callbacks as llm_callbacks
from llama_index.core.llms import llm as llm_module

from ..ir.graph import PGraph
from ..ir.node import Primitive, Ref
from ..ir.ops import Op
from ..runtime.framework_threads import in_framework_thread
from .llama_index import framework_call
from .llama_index_listening import listened, model_dict
from .llama_index_spans import span_id_of, when_dropped

logger = logging.getLogger(__name__)


class StartedCall:
    """What ``llm_start`` hands ``llm_end``: the callback event's id and what was sent. For a
    streamed call it is also the decode's listener: each chunk's in-progress event."""

    def __init__(self, events: LLMEvents, event_id: str, sent: Any, span_id: str | None,
                 predict_span_id: str | None) -> None:
        self.events = events
        self.event_id = event_id
        self.sent = sent  # the messages (chat) or the formatted prompt (completion)
        self.span_id = span_id  # the model call's span (its chat / complete)
        self.predict_span_id = predict_span_id  # predict's
        self.content = ""  # the streamed text so far
        self.ended = False  # its end reported, or due (a failure after it is not the call's)
        self._chunks: deque[tuple[str, Any]] = deque()
        self._reported = 0  # chunks whose in-progress event was reported
        self._lock = threading.Lock()
        self.pace = ReadPace.of(self) if events.streamed else None

    def __call__(self, text: str, chunk: Any = None) -> None:  # on the runtime loop, per chunk
        self._chunks.append((text, chunk))
        if self.pace is None:  # nobody reads its tokens: reported as they arrive
            asyncio.ensure_future(in_framework_thread(self.report_chunks)).add_done_callback(_logged)

    def report_chunks(self, upto: int | None = None) -> None:
        """The in-progress events of the chunks received so far (the first ``upto`` of the
        call's), in order (handlers are the user's code: never on the runtime loop)."""
        with self._lock:
            while self._chunks and (upto is None or self._reported < upto):
                text, chunk = self._chunks.popleft()
                self._reported += 1
                self.content += text
                self.events.in_progress(self, text, chunk)


    def failed(self, exc: BaseException) -> None:
        """The call failed (its span drops): the events its decorator fires then."""
        if not self.ended:
            self.ended = True
            self.events.failed(self, exc)


# The reading of the token stream a graph run is started for (set in the run's context).
_READ_PACE: contextvars.ContextVar[ReadPace | None] = contextvars.ContextVar("teola_read_pace", default=None)


class ReadPace:
    """How far a caller has read the token stream of a graph run whose last LLM call streams
    to it (``TeolaExecutor``'s ``response_gen``): that call's events are reported as plain's
    generator fires them while it is read (see the module doc). The stream's reader calls
    :meth:`read` before handing on each token, :meth:`exhausted` once it is told there are no
    more, and :meth:`leave` when it closes."""

    def __init__(self) -> None:
        self.call: StartedCall | None = None
        self._read = 0
        self._end: Any = None  # the call's end events, due once the reader is past its last token
        self._over = False  # exhausted or left: nothing is paced any more
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Inside: a graph run started here reports its streamed call at this reader's pace."""
        token = _READ_PACE.set(self)
        try:
            yield
        finally:
            _READ_PACE.reset(token)

    @staticmethod
    def of(call: StartedCall) -> ReadPace | None:
        """The pace ``call`` (a streamed call starting) is reported at, if a reader paces it:
        the first streamed call of the run only (its tokens are the ones read)."""
        pace = _READ_PACE.get()
        if pace is None:
            return None
        with pace._lock:
            if pace.call is not None or pace._over:
                return None
            pace.call = call
        return pace

    def read(self) -> None:
        """A token is about to be handed on: its chunk's in-progress event first."""
        with self._lock:
            self._read += 1
            call, read = self.call, self._read
        if call is not None:
            call.report_chunks(upto=read)

    def end_when_read(self, report: Any) -> None:
        """The call ended: its end events (``report()``) once the reader is past its last token.
        None if the reader left first (its ``GeneratorExit`` was the call's end, as plain's):
        the decode can finish while the run is being cancelled."""
        with self._lock:
            if not self._over:
                self._end = report

    def exhausted(self) -> None:
        """The reader was told there are no more tokens: what is left, and the end."""
        with self._lock:
            self._over, report, self._end = True, self._end, None
        if report is not None:
            report()

    def leave(self) -> None:
        """The reader closed the stream: a call not yet reported ended failed as plain's
        generator reports being closed (``GeneratorExit``)."""
        with self._lock:
            if self._over:
                return
            self._over, call, ending, self._end = True, self.call, self._end, None
        if call is None:
            return
        if ending is not None:  # ended, its end not reported yet: the reader left before it
            call.events.failed(call, GeneratorExit())
        else:  # still decoding: its run is cancelled next, and reports nothing more of it
            call.failed(GeneratorExit())


# A run's calls, for the ones whose failure no span reports (nobody listens to spans).
_RUN_CALLS: contextvars.ContextVar[list[StartedCall] | None] = contextvars.ContextVar("teola_llm_calls",
                                                                                      default=None)


@contextlib.contextmanager
def failed_calls_reported() -> Iterator[None]:
    """Inside (a graph run): an LLM call the run started and never ended is reported failed
    with the run's error (innermost first), where its span did not report it already."""
    calls: list[StartedCall] = []
    token = _RUN_CALLS.set(calls)
    try:
        yield
    except Exception as exc:
        for call in reversed(calls):
            call.failed(exc)
        raise
    finally:
        _RUN_CALLS.reset(token)


def _logged(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("an LLM in-progress event handler failed: %r", task.exception())


def _listened(llm: Any) -> bool:
    return listened(llm, llm_callbacks.dispatcher)


class LLMEvents:
    """The start / end steps of one lowered ``llm.predict(template, **prompt_args)``."""

    predicts = True  # ``predict``'s own LLMPredict* events around the call's

    def __init__(self, llm: Any, template: Any, prompt_args: dict[str, Any], streamed: bool = False) -> None:
        self.llm = llm
        self.template = template
        self.prompt_args = prompt_args
        self.chat = bool(llm.metadata.is_chat_model)
        self.streamed = streamed  # LLM.stream's call (its generator reports a failure)
        self.__qualname__ = f"llm_events[{type(llm).__name__}]"

    @classmethod
    def of(cls, llm: Any, template: Any, prompt_args: dict[str, Any], streamed: bool = False) -> LLMEvents | None:
        """None when nobody listens (then nothing is added to the graph)."""
        return cls(llm, template, prompt_args, streamed) if _listened(llm) else None

    def start_step(self, graph: PGraph, start_inputs: dict[str, Ref], origin: str) -> Primitive:
        """Its ``llm_start`` step (on ``start_inputs``), impure so no pass removes it; its output
        is a streamed call's decode listener."""
        return graph.add(Op.OPAQUE, name=graph.unique_name("llm_start"), inputs=start_inputs, origin=origin,
                         attrs={"fn": framework_call(self.start), "pure": False})

    def end_step(self, graph: PGraph, started: Primitive, decode: Primitive, origin: str) -> Primitive:
        """Its ``llm_end`` step after ``decode``, whose output is the decoded text once the
        call's end is reported (what ``predict`` returns, after its events)."""
        return graph.add(Op.OPAQUE, name=graph.unique_name("llm_end"),
                         inputs={"started": started.out(), "text": decode.out("text"),
                                 "response": decode.out("response")},
                         origin=origin, attrs={"fn": framework_call(self.end), "pure": False})

    def add_steps(self, graph: PGraph, start_inputs: dict[str, Ref], decode: Primitive, origin: str) -> Primitive:
        """Both steps around an unstreamed ``decode``; returns ``llm_end``."""
        return self.end_step(graph, self.start_step(graph, start_inputs, origin), decode, origin)

    def start(self, prompt: Any = None) -> StartedCall:
        llm, described = self.llm, model_dict(self.llm)
        span_id, predict_span_id = span_id_of("llm"), span_id_of("predict")
        manager = llm.callback_manager
        llm_module.dispatcher.event(LLMPredictStartEvent(template=self.template, template_args=self.prompt_args,
                                                         span_id=predict_span_id))
        log_template = getattr(llm, "_log_template_data", None)
        if log_template is not None:  # predict's TEMPLATING callback event
            log_template(self.template, **self.prompt_args)
        if self.chat:
            sent = llm._get_messages(self.template, **self.prompt_args)
            llm_callbacks.dispatcher.event(LLMChatStartEvent(model_dict=described, messages=sent,
                                                             additional_kwargs={}, span_id=span_id))
            event_id = manager.on_event_start(CBEventType.LLM, payload={
                EventPayload.MESSAGES: sent, EventPayload.ADDITIONAL_KWARGS: {}, EventPayload.SERIALIZED: described})
        else:
            sent, kwargs = llm._get_prompt(self.template, **self.prompt_args), {"formatted": True}
            llm_callbacks.dispatcher.event(LLMCompletionStartEvent(model_dict=described, prompt=sent,
                                                                   additional_kwargs=kwargs, span_id=span_id))
            event_id = manager.on_event_start(CBEventType.LLM, payload={
                EventPayload.PROMPT: sent, EventPayload.ADDITIONAL_KWARGS: kwargs, EventPayload.SERIALIZED: described})
        return _opened(StartedCall(self, event_id, sent, span_id, predict_span_id))

    def failed(self, started: StartedCall, exc: BaseException) -> None:
        """What ``llm_chat_callback`` / ``llm_completion_callback`` report of a call that raised:
        its ``LLM`` event ended with the exception; then the call's ``as_trace`` adds the trace's
        ``EXCEPTION`` event (once per exception), or a stream's generator an ``ExceptionEvent``."""
        manager = self.llm.callback_manager
        manager.on_event_end(CBEventType.LLM, payload={EventPayload.EXCEPTION: exc}, event_id=started.event_id)
        if self.streamed:
            llm_callbacks.dispatcher.event(ExceptionEvent(exception=exc, span_id=started.span_id))
        elif isinstance(exc, Exception) and not hasattr(exc, "event_added"):  # as_trace's `except Exception`
            manager.on_event_start(CBEventType.EXCEPTION, payload={EventPayload.EXCEPTION: exc})
            exc.event_added = True  # type: ignore[attr-defined]

    def in_progress(self, started: StartedCall, text: str, chunk: Any) -> None:
        """``LLM.stream_chat`` / ``stream_complete``'s event for one chunk (the OpenAI client's
        response for it: the text so far, the delta, the chunk and its token counts)."""
        counts = getattr(self.llm, "_get_response_token_counts", None)
        extra = counts(chunk) if counts is not None and chunk is not None else {}
        if self.chat:
            reply = ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=started.content),
                                 delta=text, raw=chunk, additional_kwargs=extra)
            llm_callbacks.dispatcher.event(LLMChatInProgressEvent(messages=started.sent, response=reply,
                                                                  span_id=started.span_id))
        else:
            reply = CompletionResponse(text=started.content, delta=text, raw=chunk, additional_kwargs=extra)
            llm_callbacks.dispatcher.event(LLMCompletionInProgressEvent(prompt=started.sent, response=reply,
                                                                        span_id=started.span_id))

    def end(self, started: StartedCall, text: str, response: Any = None) -> str:
        started.ended = True
        if started.pace is not None:
            started.pace.end_when_read(lambda: self._report_end(started, text, response))
        else:
            self._report_end(started, text, response)
        return text

    def _report_end(self, started: StartedCall, text: str, response: Any) -> None:
        llm, manager = self.llm, self.llm.callback_manager
        streamed = isinstance(response, tuple)
        delta = None
        started.report_chunks()  # a streamed call's last chunks first
        if streamed:  # a streamed call's chunks: plain's last response carries the last one, and its delta
            response = response[-1] if response else None
            delta = _last_delta(response, self.chat)
        reply = model_reply(llm, self.chat, text, response, delta)
        if self.chat:
            manager.on_event_end(CBEventType.LLM, payload={EventPayload.MESSAGES: started.sent,
                                                           EventPayload.RESPONSE: reply}, event_id=started.event_id)
            llm_callbacks.dispatcher.event(LLMChatEndEvent(messages=started.sent, response=reply,
                                                           span_id=started.span_id))
        else:
            manager.on_event_end(CBEventType.LLM, payload={EventPayload.PROMPT: started.sent,
                                                           EventPayload.COMPLETION: reply}, event_id=started.event_id)
            llm_callbacks.dispatcher.event(LLMCompletionEndEvent(prompt=started.sent, response=reply,
                                                                 span_id=started.span_id))
        if not streamed and self.predicts:  # LLM.stream fires no predict end: its tokens are the caller's to read
            llm_module.dispatcher.event(LLMPredictEndEvent(output=llm._parse_output(text),
                                                           span_id=started.predict_span_id))


def model_reply(llm: Any, chat: bool, text: str, raw: Any, delta: str | None = None
                ) -> ChatResponse | CompletionResponse:
    """What the model's ``chat`` (``complete``) returns for a reply with this text: the server's
    response as ``raw``, its token counts as the OpenAI classes count them."""
    counts = getattr(llm, "_get_response_token_counts", None)
    extra = counts(raw) if counts is not None and raw is not None else {}
    if chat:
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), raw=raw, delta=delta,
                            additional_kwargs=extra)
    return CompletionResponse(text=text, raw=raw, delta=delta, additional_kwargs=extra)


def return_reply(llm: Any, chat: bool, decode: Primitive, *model_spans: Any) -> None:
    """The model's ``chat`` / ``complete`` spans of one call (None where plain opens none) exit
    with the response to ``decode``'s call, built from the run's values."""
    def reply(values: Any) -> ChatResponse | CompletionResponse:
        return model_reply(llm, chat, values(decode.out("text")), values(decode.out("response")))

    for span in model_spans:
        if span is not None:
            span.result = reply


class CompleteEvents(LLMEvents):
    """The events of a lowered ``llm.complete(prompt)`` itself (a query fusion's query
    generation): what ``complete``'s decorator fires, the completion events whatever the model
    (a chat model's ``complete`` fires them too), and no predict events. ``render(query)`` is
    the prompt the caller's code formats from the query."""

    predicts = False

    def __init__(self, llm: Any, render: Any) -> None:
        self.llm, self.render, self.chat, self.streamed = llm, render, False, False
        self.__qualname__ = f"complete_events[{type(llm).__name__}]"

    @classmethod
    def of(cls, llm: Any, render: Any) -> CompleteEvents | None:  # type: ignore[override]
        return cls(llm, render) if _listened(llm) else None

    def start(self, query: Any = None) -> StartedCall:
        sent, described, span_id = self.render(query), model_dict(self.llm), span_id_of("llm")
        llm_callbacks.dispatcher.event(LLMCompletionStartEvent(model_dict=described, prompt=sent, additional_kwargs={},
                                                               span_id=span_id))
        event_id = self.llm.callback_manager.on_event_start(CBEventType.LLM, payload={
            EventPayload.PROMPT: sent, EventPayload.ADDITIONAL_KWARGS: {}, EventPayload.SERIALIZED: described})
        return _opened(StartedCall(self, event_id, sent, span_id, span_id))


def _opened(started: StartedCall) -> StartedCall:
    """``started``'s failure is reported when its span drops (before the span's own events, as
    plain's decorator reports inside the span), else when its run fails."""
    when_dropped(started.failed)
    calls = _RUN_CALLS.get()
    if calls is not None:
        calls.append(started)
    return started


def _last_delta(chunk: Any, chat: bool) -> str:
    """The delta of the response an OpenAI client's last streamed chunk became (LlamaIndex's
    ``_stream_chat`` / ``_stream_complete``: "" for a chunk without choices, the usage one)."""
    choices = getattr(chunk, "choices", None) or []
    if not choices:
        return ""
    return (getattr(choices[0].delta, "content", None) or "") if chat else (getattr(choices[0], "text", None) or "")
