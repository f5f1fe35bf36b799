"""A query the executor runs is instrumented as plain LlamaIndex instruments it: the same
dispatcher events and span (named after the engine's class), the same callback trace and
RETRIEVE event — compared side by side on small framework objects (pure logic: the run
itself is the object's own ``_query`` / ``_retrieve``)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import Response
from llama_index.core.callbacks import CallbackManager
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from teola_plugin.llama_index import instrumentation  # importing it installs the hooks


class Echo(BaseQueryEngine):
    def __init__(self, callback_manager: CallbackManager) -> None:
        super().__init__(callback_manager=callback_manager)

    def _get_prompt_modules(self) -> dict[str, Any]:
        return {}

    def _query(self, query_bundle: QueryBundle) -> Response:
        return Response(f"answer to {query_bundle.query_str}")

    async def _aquery(self, query_bundle: QueryBundle) -> Response:
        return self._query(query_bundle)


class Fixed(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text=query_bundle.query_str, id_="n1"), score=1.0)]


class Events(BaseEventHandler):
    seen: list[str] = []

    @classmethod
    def class_name(cls) -> str:
        return "Events"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.seen.append(type(event).__name__)


class Callbacks(BaseCallbackHandler):
    def __init__(self) -> None:
        super().__init__([], [])
        self.seen: list[str] = []

    def start_trace(self, trace_id: str | None = None) -> None:
        self.seen.append(f"start_trace:{trace_id}")

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        self.seen.append(f"end_trace:{trace_id}")

    def on_event_start(self, event_type, payload=None, event_id="", parent_id="", **kwargs):
        self.seen.append(f"start:{event_type.value}:{sorted(k.value for k in payload or {})}")
        return event_id

    def on_event_end(self, event_type, payload=None, event_id="", **kwargs):
        self.seen.append(f"end:{event_type.value}:{sorted(k.value for k in payload or {})}")


@pytest.fixture
def recorded():
    root = get_dispatcher()
    events, spans = Events(seen=[]), SimpleSpanHandler()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    callbacks = Callbacks()
    try:
        yield events, spans, callbacks
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)


def record(recorded, call) -> tuple[Any, list[str], list[str], list[str]]:
    events, spans, callbacks = recorded
    events.seen.clear(), spans.completed_spans.clear(), callbacks.seen.clear()
    result = call()
    names = [re.sub(r"-[0-9a-f-]{36}$", "", s.id_) for s in spans.completed_spans]
    return result, list(events.seen), names, list(callbacks.seen)


def answer(bundle: QueryBundle) -> Any:
    """What the executor's run returns here: what the object's own _query / _retrieve return."""
    return Response(f"answer to {bundle.query_str}")


def nodes(bundle: QueryBundle) -> Any:
    return [NodeWithScore(node=TextNode(text=bundle.query_str, id_="n1"), score=1.0)]


@pytest.mark.parametrize("kind", ["query", "aquery", "retrieve", "aretrieve"])
def test_the_executor_path_is_instrumented_as_plain_llamaindex(recorded, kind):
    callbacks = recorded[2]
    is_query = "query" in kind
    target = (Echo if is_query else Fixed)(callback_manager=CallbackManager([callbacks]))
    run, method = (answer if is_query else nodes), getattr(instrumentation, kind)
    if kind.startswith("a"):
        async def arun(bundle):
            return run(bundle)
        plain_call = lambda: asyncio.run(getattr(target, kind)("what?"))  # noqa: E731
        teola_call = lambda: asyncio.run(instrumentation.ainstrumented(method, target, "what?", arun))  # noqa: E731
    else:
        plain_call = lambda: getattr(target, kind)("what?")  # noqa: E731
        teola_call = lambda: instrumentation.instrumented(method, target, "what?", run)  # noqa: E731
    plain = record(recorded, plain_call)
    teola = record(recorded, teola_call)
    assert str(teola[0]) == str(plain[0])
    start, end = ("QueryStartEvent", "QueryEndEvent") if is_query else ("RetrievalStartEvent", "RetrievalEndEvent")
    assert teola[1] == plain[1] == [start, end]
    owner = type(target).__name__
    assert teola[2] == [f"{owner}.{kind}"]  # the outer span, named as plain LlamaIndex names it
    assert plain[2][-1] == f"{owner}.{kind}"  # plain: the same, around its own inner _query / _retrieve span
    assert teola[3] == plain[3]  # callback trace "query" (+ the RETRIEVE event with its payloads)
    assert teola[3][0] == "start_trace:query" and teola[3][-1] == "end_trace:query"


def test_aquery_of_a_sync_stream_gives_what_plain_aquery_gives():
    """An opaque step may stream through LlamaIndex's sync path; ``aquery`` still returns an
    AsyncStreamingResponse with the same tokens, sources and metadata."""
    from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse

    from teola_plugin.llama_index.executor import as_async_streaming

    sources = nodes(QueryBundle("q"))
    sync = StreamingResponse(iter(["a", "b", "c"]), source_nodes=sources, metadata={"k": 1})
    converted = as_async_streaming(sync)
    assert isinstance(converted, AsyncStreamingResponse)
    assert converted.source_nodes == sources and converted.metadata == {"k": 1}

    async def read() -> list[str]:
        return [t async for t in converted.async_response_gen()]

    assert asyncio.run(read()) == ["a", "b", "c"]
    done = StreamingResponse(None, source_nodes=sources, response_txt="abc")
    assert asyncio.run(as_async_streaming(done).get_response()).response == "abc"


@pytest.mark.parametrize("kind", ["query", "aquery", "retrieve", "aretrieve"])
def test_an_unlowered_engine_run_by_the_executor_is_instrumented_once(recorded, kind):
    """No rule lowers these objects: the executor runs each as one opaque step, inside the
    entry point's instrumentation, and the step itself does not emit it again."""
    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.runtime.runtime import Runtime

    runtime = Runtime(engines={}, hosting="local")
    try:
        executor = TeolaExecutor(runtime=runtime)
        is_query = "query" in kind
        target = (Echo if is_query else Fixed)(callback_manager=CallbackManager([recorded[2]]))
        call = getattr(executor, kind)
        run = (lambda: asyncio.run(call(target, "what?"))) if kind.startswith("a") else (lambda: call(target, "what?"))
        result, events, spans, callbacks = record(recorded, run)
        plain = record(recorded, lambda: asyncio.run(getattr(target, kind)("what?")) if kind.startswith("a")
                       else getattr(target, kind)("what?"))
    finally:
        runtime.shutdown()
    assert str(result) == str(plain[0])
    assert events == plain[1]  # one start, one end: as plain
    assert spans.count(f"{type(target).__name__}.{kind}") == 1
    assert callbacks == plain[3]


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("mode", ["compact", "refine", "tree_summarize", "simple_summarize", "compact_accumulate"])
def test_an_answer_the_executor_computes_opens_plains_get_response_spans_and_events(recorded, mode, async_):
    """A synthesizer that code running as it is calls (a chat engine, an index build) is
    answered by the executor inside the spans plain's ``get_response`` opens (a compact
    refine or accumulate: two, the inner over what it compacted) and a refine's
    ``GetResponseStart`` / ``End`` events. Plain's own LLM calls (a mock here) add spans and
    events of their own."""
    from teola_plugin.capture.llama_index_synthesis import SynthesisPlanner
    from llama_index.core import get_response_synthesizer
    from llama_index.core.llms import MockLLM

    from teola_plugin.llama_index.executor import AnswerPacking, PlannedAnswer

    synth = get_response_synthesizer(llm=MockLLM(max_tokens=4), response_mode=mode)
    chunks = ["The Louvre is in Paris.", "Big Ben is in London."]
    packing = AnswerPacking(SynthesisPlanner(synth, synth._llm, None, lambda graph: graph), "Where?", chunks)
    if async_:
        async def answer() -> str:
            return "answer"
        planned = PlannedAnswer(answer, packing)
        plain = record(recorded, lambda: asyncio.run(synth.aget_response("Where?", chunks)))
        teola = record(recorded, lambda: asyncio.run(instrumentation.aanswered(synth, "Where?", chunks, planned)))
    else:
        planned = PlannedAnswer(lambda: "answer", packing)
        plain = record(recorded, lambda: synth.get_response("Where?", chunks))
        teola = record(recorded, lambda: instrumentation.answered(synth, "Where?", chunks, planned))
    assert teola[0] == "answer"
    own_spans = lambda names: [n for n in names if n.endswith("get_response")]  # noqa: E731
    own_events = lambda names: [n for n in names if n.startswith("GetResponse")]  # noqa: E731
    assert own_spans(teola[2]) == own_spans(plain[2]) and own_spans(plain[2])
    assert own_events(teola[1]) == own_events(plain[1])
    assert own_events(plain[1]) == (["GetResponseStartEvent", "GetResponseEndEvent"] if "refine" in mode or
                                    mode == "compact" else [])
