"""LlamaIndex integration on the real engines: TeolaExecutor vs plain LlamaIndex.

One session runtime (tests/fixtures_runtime.py); a small index of bundled SQuAD passages
embedded by TeolaEmbedding; TeolaLLM greedy with few tokens. Prompts are captured where
each path hands them to the engine: TeolaLLM's engine call (plain LlamaIndex) and the
``llm_prefill`` handler (Teola), so "same prompt" means the same request reached vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import Response
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from teola_plugin import datasets
from teola_plugin.errors import ConfigError
from teola_plugin.llama_index import TeolaEmbedding, TeolaExecutor, TeolaLLM
from teola_plugin.runtime.handlers import PrimitiveHandlers

pytestmark = pytest.mark.slow

PASSAGES = 30
MAX_TOKENS = 24
QUESTIONS = [q.question for q in datasets.load_questions("squad-xquad-en", limit=40)[::13]]  # 4 topics


class RecordingLLM(TeolaLLM):
    """TeolaLLM that records every request it sends to the engine (the plain path)."""

    sent: ClassVar[list[Any]] = []

    async def _engine_generate(self, prompt, params):
        RecordingLLM.sent.append(prompt)
        return await super()._engine_generate(prompt, params)

    async def _engine_stream(self, prompt, params):
        RecordingLLM.sent.append(prompt)
        async for delta in super()._engine_stream(prompt, params):
            yield delta


class RecordingHandlers(PrimitiveHandlers):
    """Records the prompt of every llm_prefill (the Teola path)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def llm_prefill(self, prim, inputs, ctx):
        self.sent.append(inputs["prompt"])
        return await super().llm_prefill(prim, inputs, ctx)


@contextlib.contextmanager
def teola_prompts(runtime) -> Iterator[list[Any]]:
    handlers, runtime.handlers = runtime.handlers, RecordingHandlers()
    try:
        yield runtime.handlers.sent
    finally:
        runtime.handlers = handlers


@contextlib.contextmanager
def plain_prompts() -> Iterator[list[Any]]:
    RecordingLLM.sent = []
    yield RecordingLLM.sent


@contextlib.contextmanager
def dispatched_events() -> Iterator[list[str]]:
    """The names of LlamaIndex instrumentation events emitted meanwhile."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    class Names(BaseEventHandler):
        seen: list[str] = []

        def handle(self, event: Any, **kwargs: Any) -> None:
            self.seen.append(type(event).__name__)

    handler, root = Names(seen=[]), get_dispatcher()
    root.add_event_handler(handler)
    try:
        yield handler.seen
    finally:
        root.event_handlers.remove(handler)


@pytest.fixture(scope="module")
def llm(runtime):
    return RecordingLLM(runtime=runtime, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def index(runtime):
    passages = datasets.load_corpus("squad-xquad-en")[:PASSAGES]
    docs = [Document(text=p.text, metadata={"title": p.title}, id_=p.id) for p in passages]
    return VectorStoreIndex.from_documents(docs, embed_model=TeolaEmbedding(runtime=runtime))


@pytest.fixture(scope="module")
def executor(runtime):
    return TeolaExecutor(runtime=runtime)


@pytest.fixture(autouse=True)
def plain_settings():
    Settings.executor = None
    yield
    Settings.executor = None


def ids(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.node_id for n in nodes]


def assert_same_response(teola: Response, plain: Response) -> None:
    assert type(teola) is type(plain) is Response
    assert ids(teola.source_nodes) == ids(plain.source_nodes)
    assert [n.score for n in teola.source_nodes] == pytest.approx([n.score for n in plain.source_nodes], abs=1e-5)
    assert teola.metadata == plain.metadata
    assert teola.response == plain.response


# -- fidelity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,top_k", [("compact", 3), ("refine", 2), ("simple_summarize", 2)])
def test_same_prompts_nodes_and_answers_as_plain_llamaindex(runtime, index, llm, executor, mode, top_k):
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=top_k, response_mode=mode)
    questions = QUESTIONS[:2] if mode == "compact" else QUESTIONS[:1]
    for question in questions:
        with plain_prompts() as sent_plain:
            plain = query_engine.query(question)
        with teola_prompts(runtime) as sent_teola:
            teola = executor.query(query_engine, question)
        assert sent_teola == sent_plain and sent_plain  # the identical requests reached vLLM
        assert_same_response(teola, plain)
    if mode == "refine":  # one sequential call per node: the expansion really chained them
        assert len(sent_teola) == top_k


def query_both(runtime, executor, query_engine, question: str) -> tuple[Any, Any, list[Any], list[Any]]:
    """Plain's response and Teola's, with the requests each sent to vLLM."""
    with plain_prompts() as sent_plain:
        plain = query_engine.query(question)
    with teola_prompts(runtime) as sent_teola:
        teola = executor.query(query_engine, question)
    return plain, teola, sent_plain, sent_teola


def test_citation_query_engine_is_lowered_with_plains_prompts_and_sources(runtime, index, llm, executor):
    """``CitationQueryEngine.from_args`` as LlamaIndex's citation guide writes it: retrieval
    lowered, the numbered source chunks made by its own code, the citation prompts sent as
    plain sends them, the same answer and sources (chunks get new ids in both)."""
    from llama_index.core.query_engine import CitationQueryEngine

    query_engine = CitationQueryEngine.from_args(index, llm=llm, similarity_top_k=2, citation_chunk_size=256)
    assert executor.traced(query_engine).opaque == []
    plain, teola, sent_plain, sent_teola = query_both(runtime, executor, query_engine, QUESTIONS[0])
    assert sent_teola == sent_plain and "Source 1:" in str(sent_plain[0])
    assert teola.response == plain.response
    texts = lambda response: [n.node.get_content() for n in response.source_nodes]  # noqa: E731
    assert texts(teola) == texts(plain) and texts(plain)[0].startswith("Source 1:")


def test_document_summary_index_query_engine_is_lowered(runtime, llm, executor):
    """``DocumentSummaryIndex.from_documents(...).as_query_engine()`` as LlamaIndex's guide
    writes it: the query embedding on the engine, the summaries searched by its own code,
    the same prompts, answer and source nodes as plain."""
    from llama_index.core import DocumentSummaryIndex
    from llama_index.core.node_parser import SentenceSplitter

    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:3]]
    summaries = DocumentSummaryIndex.from_documents(docs, llm=llm, embed_model=TeolaEmbedding(runtime=runtime),
                                                    transformations=[SentenceSplitter(chunk_size=256)])
    query_engine = summaries.as_query_engine(llm=llm)
    assert executor.traced(query_engine).opaque == []
    plain, teola, sent_plain, sent_teola = query_both(runtime, executor, query_engine, QUESTIONS[0])
    assert sent_teola == sent_plain and sent_plain
    assert teola.response == plain.response and ids(teola.source_nodes) == ids(plain.source_nodes)
    assert {"embed"} <= {s.op for s in runtime.timeline.spans([executor.last_query_id])}


def test_trace_lowers_the_retrieval_and_expands_synthesis(index, llm, executor):
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=3)
    graph = executor.trace(query_engine)
    ops = [p.op.value for p in graph.nodes]
    assert ops.count("embed") == 1 and ops.count("vector_search") == 1
    assert graph["vector_search"].attrs["top_k"] == 3
    assert all(p.after or not i for i, p in enumerate(graph.nodes))  # module order recorded
    text = executor.explain(query_engine)
    assert "Opaque components: none" in text
    assert "synthesize (CompactAndRefine)" in text and "mermaid" in text and "prune_dependencies" in text


def test_streaming_query_engine_streams_the_same_tokens(runtime, index, llm, executor):
    from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse

    query_engine = index.as_query_engine(llm=llm, similarity_top_k=2, streaming=True)
    question = QUESTIONS[3]
    with plain_prompts() as sent_plain:
        plain = query_engine.query(question)
        plain_text = "".join(plain.response_gen)
    with teola_prompts(runtime) as sent_teola:
        teola = executor.query(query_engine, question)
        assert isinstance(teola, StreamingResponse)
        tokens = list(teola.response_gen)
    assert sent_teola == sent_plain and sent_plain
    assert len(tokens) > 1 and "".join(tokens) == plain_text  # streamed as decoded, same text
    assert ids(teola.source_nodes) == ids(plain.source_nodes) and teola.metadata == plain.metadata
    assert {"llm_decode"} <= {s.op for s in runtime.timeline.spans([executor.last_query_id])}

    async def astream() -> tuple[type, str]:
        response = await executor.aquery(query_engine, question)
        return type(response), "".join([t async for t in response.async_response_gen()])

    assert asyncio.run(astream()) == (AsyncStreamingResponse, plain_text)


# -- the drop-in hook ------------------------------------------------------------------------------
def test_a_lowered_query_engine_reports_plains_query_callback_event_and_trace(runtime, index, llm, executor):
    """``LlamaDebugHandler.get_event_pairs(CBEventType.QUERY)``, as LlamaIndex's docs use it: a
    lowered ``RetrieverQueryEngine``'s query (sync, async) reports the one QUERY event its own
    ``_query`` opens, with plain's query string and response; and the trace map the callback
    manager hands its handlers at the trace's end nests every event where plain's does (the
    query embedding's ``EMBEDDING`` under ``RETRIEVE``, though the retrieval's primitives run
    in tasks of their own)."""
    from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
    from llama_index.core.query_engine import RetrieverQueryEngine

    class TraceTrees(LlamaDebugHandler):
        """Each ended trace as a tree of event types (children sorted: concurrent ones vary)."""

        trees: ClassVar[list[str]] = []

        def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
            kinds = {event.id_: event.event_type.value for event in self.get_events()}

            def tree(node: str) -> str:
                children = sorted(tree(child) for child in (trace_map or {}).get(node, []))
                return kinds.get(node, node) + (f"({','.join(children)})" if children else "")

            self.trees.append(tree("root"))
            super().end_trace(trace_id, trace_map)

    debug = TraceTrees(print_trace_on_end=False)
    previous, Settings.callback_manager = Settings._callback_manager, CallbackManager([debug])  # as the docs set it
    try:  # the index over the same nodes, its embedding, the engine, its synthesizer and LLM report to it
        observed = VectorStoreIndex(index_struct=index.index_struct, storage_context=index.storage_context,
                                    embed_model=TeolaEmbedding(runtime=runtime))
        query_engine = RetrieverQueryEngine.from_args(observed.as_retriever(similarity_top_k=2), llm=llm)
    finally:
        Settings._callback_manager = previous

    def query_events(call) -> tuple[list[tuple[str, str]], list[str]]:
        debug.flush_event_logs()
        debug.trees.clear()
        call()
        return [(start.payload[EventPayload.QUERY_STR], str(end.payload[EventPayload.RESPONSE]))
                for start, end in debug.get_event_pairs(CBEventType.QUERY)], list(debug.trees)

    plain = query_events(lambda: query_engine.query(QUESTIONS[0]))
    assert executor.traced(query_engine).opaque == []
    assert query_events(lambda: executor.query(query_engine, QUESTIONS[0])) == plain
    assert query_events(lambda: asyncio.run(executor.aquery(query_engine, QUESTIONS[0]))) == plain
    assert len(plain[0]) == 1 and plain[0][0][0] == QUESTIONS[0]
    assert plain[1] == ["root(query(retrieve(embedding),synthesize(llm,templating)))"], plain[1]


def test_a_synthesis_over_no_nodes_reports_no_synthesize_callback_event_as_plain(runtime, index, llm, executor):
    """A postprocessor that leaves no node: plain's ``synthesize`` answers "Empty Response"
    before it opens its ``SYNTHESIZE`` callback event (the dispatcher's start / end events
    still fire); the lowered query reports the same events."""
    from collections import Counter

    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.postprocessor import SimilarityPostprocessor
    from llama_index.core.query_engine import RetrieverQueryEngine

    class Names(BaseEventHandler):
        names: list = []

        def handle(self, event, **kwargs) -> None:
            self.names.append(event.class_name())

    debug, names = LlamaDebugHandler(), Names()
    get_dispatcher().add_event_handler(names)
    query_engine = RetrieverQueryEngine.from_args(
        index.as_retriever(similarity_top_k=2), llm=llm, callback_manager=CallbackManager([debug]),
        node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=1.01)])

    def events(call) -> tuple[Counter, list[str], str]:
        debug.flush_event_logs()
        names.names.clear()
        answer = str(call())
        return Counter(e.event_type.value for e in debug.get_events()), sorted(
            n for n in names.names if n.startswith(("Synthesize", "Query", "Retrieval"))), answer

    try:
        plain = events(lambda: query_engine.query(QUESTIONS[0]))
        assert executor.traced(query_engine).opaque == []
        assert events(lambda: executor.query(query_engine, QUESTIONS[0])) == plain
    finally:
        get_dispatcher().event_handlers.remove(names)
    assert plain[2] == "Empty Response" and "synthesize" not in plain[0] and "SynthesizeStartEvent" in plain[1]


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("mode", ["compact_accumulate", "compact", "tree_summarize"])
def test_a_lowered_querys_spans_nest_as_plains(runtime, index, llm, executor, mode, async_):
    """A span handler alone (no event handler, no callback): every span plain opens, under
    the span plain opens it in, exiting with what plain's method returns. The query
    embedding's ``get_query_embedding`` spans under the retriever's ``_retrieve`` (they were
    missing without an event handler); the packing's ``split_text`` under ``get_response``
    (the synthesis is planned in it at run time; it was under ``synthesize``); the model's
    ``chat`` / ``complete`` returning its response, ``predict`` and ``get_response`` the text,
    the embedding its list of floats (they exited with None); a model whose ``chat`` override
    does not call ``super()`` (``TeolaLLM``) opens one ``chat`` span, not two.
    ``CompactAndAccumulate.get_response`` repacks the texts once, then each packed chunk for
    its call: as many ``split_text`` spans."""
    import re
    from collections import Counter

    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler

    results: list[tuple[str | None, Any]] = []  # (span, what it exited with)

    class Results(SimpleSpanHandler):
        def prepare_to_exit_span(self, id_, bound_args, instance=None, result=None, **kwargs):
            results.append((name(id_), described(result)))
            return super().prepare_to_exit_span(id_, bound_args, instance=instance, result=result, **kwargs)

    def described(result: Any) -> Any:
        if isinstance(result, list):
            return "list", len(result), tuple(sorted({type(x).__name__ for x in result}))
        text = getattr(result, "text", None) or getattr(getattr(result, "message", None), "content", None)
        return type(result).__name__, text if text is not None else str(result)[:200]

    spans = Results()
    get_dispatcher().add_span_handler(spans)
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=3, response_mode=mode)

    def name(span_id: str | None) -> str | None:
        return None if span_id is None else re.sub(r"-[0-9a-f-]{36}$", "", span_id)

    def nested(query) -> tuple[str, Counter, Counter]:
        spans.completed_spans.clear()
        results.clear()
        answer = str(asyncio.run(query(QUESTIONS[0])) if async_ else query(QUESTIONS[0]))
        return (answer, Counter((name(s.id_), name(s.parent_id)) for s in spans.completed_spans),
                Counter(results))

    try:
        plain = nested(query_engine.aquery if async_ else query_engine.query)
        assert executor.traced(query_engine).opaque == []
        teola = nested(lambda q: executor.aquery(query_engine, q) if async_ else executor.query(query_engine, q))
    finally:
        get_dispatcher().span_handlers.remove(spans)
    assert teola[0] == plain[0]
    assert teola[1] == plain[1], (teola[1] - plain[1], plain[1] - teola[1])
    assert teola[2] == plain[2], (teola[2] - plain[2], plain[2] - teola[2])
    get_response = ("aget_response" if async_ else "get_response")
    retrieve = ("_aretrieve" if async_ else "_retrieve")
    embedding = ("aget_query_embedding" if async_ else "get_query_embedding")
    splits = {parent: n for (span, parent), n in plain[1].items() if span == "TokenTextSplitter.split_text"}
    assert splits and all(parent.endswith(get_response) for parent in splits), splits
    assert plain[1][(f"TeolaEmbedding.{embedding}", f"VectorIndexRetriever.{retrieve}")] == 1
    returned = {span: result[0] for span, result in plain[2]}  # the types, where plain's spans exit
    synthesizer = type(query_engine._response_synthesizer).__name__
    assert returned[f"TeolaEmbedding.{embedding}"] == "list" and returned[f"{synthesizer}.{get_response}"] == "str"
    assert returned[f"RecordingLLM.{'apredict' if async_ else 'predict'}"] == "str"
    if mode == "compact_accumulate":
        assert sum(splits.values()) >= 2  # the texts once, then each packed chunk for its call


def test_settings_executor_routes_query_engines_and_retrievers(runtime, index, llm, executor):
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=3)
    retriever = index.as_retriever(similarity_top_k=3)
    question = QUESTIONS[1]
    plain = query_engine.query(question)
    plain_nodes = retriever.retrieve(question)
    seen = set(runtime.timeline.query_ids())

    Settings.executor = executor
    with dispatched_events() as events:
        teola = query_engine.query(question)
    assert events[0] == "QueryStartEvent" and events[-1] == "QueryEndEvent"  # observability as plain
    qid = executor.last_query_id
    assert qid not in seen
    ran = {s.op for s in runtime.timeline.spans([qid])}
    assert {"embed", "vector_search", "llm_prefill", "llm_decode"} <= ran  # it ran on Teola
    assert_same_response(teola, plain)

    assert ids(retriever.retrieve(question)) == ids(plain_nodes)
    assert executor.last_query_id != qid
    assert ids(asyncio.run(retriever.aretrieve(QueryBundle(question)))) == ids(plain_nodes)
    async_response = asyncio.run(query_engine.aquery(question))
    assert_same_response(async_response, plain)
    assert {"llm_decode"} <= {s.op for s in runtime.timeline.spans([executor.last_query_id])}

    Settings.executor = None  # plain LlamaIndex again: nothing new on the timeline
    last = executor.last_query_id
    assert query_engine.query(question).response == plain.response
    assert executor.last_query_id == last


def test_chroma_vector_store_is_searched_in_place(runtime, executor):
    """The user's own Chroma collection, searched through the retriever's code path."""
    import chromadb
    from llama_index.core import StorageContext
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().get_or_create_collection("teola-li-test")
    store = ChromaVectorStore(chroma_collection=collection)
    passages = datasets.load_corpus("squad-xquad-en")[:12]
    index = VectorStoreIndex.from_documents(
        [Document(text=p.text, id_=p.id) for p in passages], embed_model=TeolaEmbedding(runtime=runtime),
        storage_context=StorageContext.from_defaults(vector_store=store))
    retriever = index.as_retriever(similarity_top_k=4)
    assert executor.traced(retriever).opaque == []
    for question in QUESTIONS[:2]:
        plain = retriever.retrieve(question)
        teola = executor.retrieve(retriever, question)
        assert ids(teola) == ids(plain) and len(plain) == 4
        assert [n.score for n in teola] == pytest.approx([n.score for n in plain], abs=1e-5)
    # an empty query has nothing to embed: plain searches Chroma without a vector, and Chroma
    # answers (SimpleVectorStore raises instead: test_reliability_input), so Teola answers alike
    plain = retriever.retrieve("")
    assert ids(executor.retrieve(retriever, "")) == ids(plain) and plain


# -- what the tracer does not know stays opaque --------------------------------------------------
class KeepFirstTwo(BaseNodePostprocessor):
    """A user's own postprocessor: no lowering rule."""

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return nodes[:2]


class FixedRetriever(BaseRetriever):
    """A user's own retriever over the index's retriever: no lowering rule."""

    def __init__(self, inner: BaseRetriever) -> None:
        super().__init__()
        self.inner = inner

    def _retrieve(self, query_bundle):
        return self.inner.retrieve(query_bundle)[::-1]


def test_cpu_postprocessors_of_the_docs_are_lowered_with_plains_nodes(runtime, llm, executor):
    """``PrevNextNodePostprocessor`` (reads the docstore), ``FixedRecencyPostprocessor`` and
    ``KeywordNodePostprocessor`` run their own code as CPU steps of the graph: nothing opaque,
    plain's sources and answer (and plain's ImportError where spaCy is missing)."""
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.postprocessor import (FixedRecencyPostprocessor, KeywordNodePostprocessor,
                                                PrevNextNodePostprocessor)

    passages = datasets.load_corpus("squad-xquad-en")[:6]
    docs = [Document(text=p.text, metadata={"date": f"2024-0{i + 1}-01"}, id_=p.id) for i, p in enumerate(passages)]
    small = VectorStoreIndex.from_documents(docs, embed_model=TeolaEmbedding(runtime=runtime),
                                            transformations=[SentenceSplitter(chunk_size=64, chunk_overlap=0)])
    for postprocessors in ([PrevNextNodePostprocessor(docstore=small.docstore, num_nodes=1, mode="both")],
                           [FixedRecencyPostprocessor(top_k=2, date_key="date")],
                           [KeywordNodePostprocessor(required_keywords=["the"])]):
        engine = small.as_query_engine(llm=llm, similarity_top_k=3, node_postprocessors=postprocessors)
        assert executor.traced(engine).opaque == []
        try:
            plain = engine.query(QUESTIONS[0])
        except ImportError as missing:  # KeywordNodePostprocessor without spaCy
            with pytest.raises(ImportError) as teola:
                executor.query(engine, QUESTIONS[0])
            assert str(teola.value) == str(missing)
            continue
        assert_same_response(executor.query(engine, QUESTIONS[0]), plain)
        if isinstance(postprocessors[0], PrevNextNodePostprocessor):
            assert len(plain.source_nodes) > 3  # the neighbours came from the docstore


def test_unknown_components_stay_opaque_and_answer_right(runtime, index, llm, executor):
    engine = index.as_query_engine(llm=llm, similarity_top_k=3,
                                   node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=0.0),
                                                        KeepFirstTwo()])
    text = executor.explain(engine)
    assert "KeepFirstTwo" in text and "no lowering rule" in text and "SimilarityPostprocessor" not in text.split(
        "Data-dependent")[0]
    assert [n.component for n in executor.traced(engine).opaque] == ["KeepFirstTwo"]
    assert "vector_search" in {p.op.value for p in executor.trace(engine).nodes}  # the rest is lowered
    question = QUESTIONS[2]
    plain = engine.query(question)
    with teola_prompts(runtime) as sent_teola:
        teola = executor.query(engine, question)
    assert len(teola.source_nodes) == 2 and len(sent_teola) == 1
    assert_same_response(teola, plain)

    from llama_index.core.query_engine import RetrieverQueryEngine

    custom = RetrieverQueryEngine.from_args(FixedRetriever(index.as_retriever(similarity_top_k=2)), llm=llm)
    assert [n.component for n in executor.traced(custom).opaque] == ["FixedRetriever"]
    plain = custom.query(question)
    Settings.executor = executor  # inner.retrieve inside the opaque step must run the original
    teola = custom.query(question)
    assert_same_response(teola, plain)


class _AsyncOnly:
    """Components with no sync path (as async-first integrations write them): the sync
    method raises; the async one records the loop it ran on."""

    loops: ClassVar[list[Any]] = []

    @classmethod
    def ran(cls) -> None:
        cls.loops.append(asyncio.get_running_loop())

    @staticmethod
    def no_sync(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("async only")


class AsyncOnlyRetriever(BaseRetriever):
    def __init__(self, inner: BaseRetriever) -> None:
        super().__init__()
        self.inner = inner

    _retrieve = _AsyncOnly.no_sync

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        _AsyncOnly.ran()
        return await self.inner.aretrieve(query_bundle)  # the executor's again (lowered)


class AsyncOnlyPostprocessor(BaseNodePostprocessor):
    _postprocess_nodes = _AsyncOnly.no_sync

    async def _apostprocess_nodes(self, nodes, query_bundle=None):
        _AsyncOnly.ran()
        return nodes[:2]


def _async_only_synthesizer(llm):
    from llama_index.core.response_synthesizers.base import BaseSynthesizer

    class AsyncOnlySynthesizer(BaseSynthesizer):
        get_response = _AsyncOnly.no_sync

        async def aget_response(self, query_str, text_chunks, **kwargs):
            _AsyncOnly.ran()
            return f"{len(text_chunks)} passages for: {query_str}"

        def _get_prompts(self):
            return {}

        def _update_prompts(self, prompts) -> None:
            pass

    return AsyncOnlySynthesizer(llm=llm)


def test_async_queries_await_opaque_components_async_methods_on_the_callers_loop(index, llm, executor):
    """``aquery`` / ``aretrieve``: an opaque retriever, postprocessor, synthesizer and query
    engine run their async methods, on the caller's loop, as plain does (their sync methods
    raise); the sync entry points fail as plain's do."""
    from llama_index.core.query_engine import CustomQueryEngine, RetrieverQueryEngine

    class AsyncOnlyQueryEngine(CustomQueryEngine):
        custom_query = _AsyncOnly.no_sync

        async def acustom_query(self, query_str: str) -> str:
            _AsyncOnly.ran()
            return query_str.upper()

    retriever = AsyncOnlyRetriever(index.as_retriever(similarity_top_k=3))
    engine = RetrieverQueryEngine(retriever=retriever, response_synthesizer=_async_only_synthesizer(llm),
                                  node_postprocessors=[AsyncOnlyPostprocessor()])
    assert {n.component for n in executor.traced(engine).opaque} == {
        "AsyncOnlyRetriever", "AsyncOnlyPostprocessor", "AsyncOnlySynthesizer"}
    question = QUESTIONS[1]

    async def both(call_plain, call_teola) -> tuple[Any, Any, bool]:
        _AsyncOnly.loops.clear()
        plain = await call_plain()
        plain_loops = len(_AsyncOnly.loops)
        teola = await call_teola()
        loop = asyncio.get_running_loop()
        return plain, teola, _AsyncOnly.loops == [loop] * (2 * plain_loops) and plain_loops > 0

    plain, teola, on_caller = asyncio.run(both(lambda: engine.aquery(question),
                                               lambda: executor.aquery(engine, question)))
    assert on_caller and str(teola) == str(plain) == f"2 passages for: {question}"
    assert ids(teola.source_nodes) == ids(plain.source_nodes)
    plain, teola, on_caller = asyncio.run(both(lambda: retriever.aretrieve(question),
                                               lambda: executor.aretrieve(retriever, question)))
    assert on_caller and ids(teola) == ids(plain) and len(plain) == 3
    custom = AsyncOnlyQueryEngine()
    plain, teola, on_caller = asyncio.run(both(lambda: custom.aquery(question),
                                               lambda: executor.aquery(custom, question)))
    assert on_caller and str(teola) == str(plain) == question.upper()
    for sync_call in (lambda: engine.query(question), lambda: executor.query(engine, question)):
        with pytest.raises(RuntimeError, match="async only"):
            sync_call()


# -- bad input ------------------------------------------------------------------------------------------
def test_unsupported_objects_and_bad_config_fail_clearly(executor):
    with pytest.raises(TypeError, match="BaseQueryEngine"):
        executor.query("not a query engine", "q")
    with pytest.raises(TypeError, match="BaseRetriever"):
        executor.retrieve(object(), "q")
    with pytest.raises(TypeError, match="cannot trace"):
        executor.trace(42)
    with pytest.raises(TypeError, match=r"chat engines .* executor\.explain\(obj\) says where their calls go"):
        executor.traced(object())  # what a chat engine or an agent meets: where to look instead
    with pytest.raises(ConfigError, match="unknown optimizer pass 'no_such_pass'"):
        TeolaExecutor(passes=["no_such_pass"])
    with pytest.raises(ConfigError, match="timeout_s"):
        TeolaExecutor(timeout_s=0)
    with pytest.raises(ValueError):
        TeolaLLM(max_tokens=0)


class Exploding(BaseNodePostprocessor):
    def _postprocess_nodes(self, nodes, query_bundle=None):
        raise LookupError("no such shelf: 42")


def test_component_errors_reach_the_caller_unchanged(index, llm, executor):
    engine = index.as_query_engine(llm=llm, node_postprocessors=[Exploding()])
    with pytest.raises(LookupError) as plain:
        engine.query(QUESTIONS[0])
    with pytest.raises(LookupError) as teola:
        executor.query(engine, QUESTIONS[0])
    assert str(teola.value) == str(plain.value) == "no such shelf: 42"
    assert any("Exploding" in note for note in teola.value.__notes__)  # names where it came from


# -- the plugin's LLM on its own -------------------------------------------------------------------
def test_teola_llm_complete_chat_stream_async(runtime):
    from llama_index.core.llms import ChatMessage

    llm = TeolaLLM(runtime=runtime, max_tokens=12)
    assert llm.metadata.context_window == 4096 and llm.metadata.is_chat_model
    text = llm.complete("The capital of France is").text
    assert text and "".join(r.delta for r in llm.stream_complete("The capital of France is")) == text
    assert asyncio.run(llm.acomplete("The capital of France is")).text == text
    messages = [ChatMessage(role="user", content="Say hello.")]
    reply = llm.chat(messages).message.content
    assert reply and list(llm.stream_chat(messages))[-1].message.content == reply

    async def astream() -> str:
        return "".join([r.delta async for r in await llm.astream_chat(messages)])

    assert asyncio.run(astream()) == reply


def test_a_bad_ray_address_fails_at_construction():
    from teola_plugin.llama_index import TeolaExecutor

    with pytest.raises(ConfigError, match="cannot reach the Ray cluster"):
        TeolaExecutor(ray_address="127.0.0.1:1")
    with pytest.raises(ConfigError, match="host:port"):
        TeolaExecutor(ray_address="not-an-address")


def test_two_executors_on_one_runtime_search_one_store_through_the_engine_serving_it(runtime, index, executor):
    """The runtime serves one engine per user store; an executor tracing the store after
    another one did must bind its retrievers on that engine (not on a copy nobody serves)."""
    other = TeolaExecutor(runtime=runtime)
    question = QUESTIONS[0]
    plain = index.as_retriever(similarity_top_k=2).retrieve(question)
    first = executor.retrieve(index.as_retriever(similarity_top_k=2), question)
    second = other.retrieve(index.as_retriever(similarity_top_k=2), question)
    again = executor.retrieve(index.as_retriever(similarity_top_k=2), question)
    assert ids(first) == ids(second) == ids(again) == ids(plain) and len(plain) == 2


def test_an_index_built_per_request_is_not_kept_alive_by_the_runtime(runtime, index, executor):
    """Document QA builds an index per request: once the app drops it, the engine serving its
    store goes too (a runtime serving many requests must not keep every upload), and the
    retrievers a long-lived index hands out per query are not kept either."""
    import gc
    import weakref

    passages = datasets.load_corpus("squad-xquad-en")[PASSAGES:PASSAGES + 6]

    def one_request() -> tuple[weakref.ref, str, list[str], list[str]]:
        upload = VectorStoreIndex.from_documents([Document(text=p.text, id_=p.id) for p in passages],
                                                 embed_model=TeolaEmbedding(runtime=runtime))
        nodes = executor.retrieve(upload.as_retriever(similarity_top_k=2), QUESTIONS[0])
        store = upload.vector_store
        (name,) = [n for n in runtime.local_engines() if n.endswith(f"-{id(store):x}")]
        return weakref.ref(store), name, ids(nodes), ids(upload.as_retriever(similarity_top_k=2).retrieve(QUESTIONS[0]))

    store, name, got, plain = one_request()
    gc.collect()
    assert got == plain and len(got) == 2
    assert store() is None, "the runtime kept the per-request store alive"
    assert name not in runtime.local_engines()

    for _ in range(3):  # a new query engine per request over the long-lived index
        executor.retrieve(index.as_retriever(similarity_top_k=2), QUESTIONS[0])
    gc.collect()
    served = runtime.local_engines()[f"llama_index-{type(index.vector_store).__name__}-{id(index.vector_store):x}"]
    assert served.describe()["indexes"] == []  # every per-request retriever went with its request
    assert ids(executor.retrieve(index.as_retriever(similarity_top_k=2), QUESTIONS[0])) == ids(
        index.as_retriever(similarity_top_k=2).retrieve(QUESTIONS[0]))
    assert len(served._retrievers) == 1  # binding forgets the collected ones (not only hides them)


def test_an_index_nodes_object_is_retrieved_as_the_caller_retrieves_with_the_callers_embedding(runtime, executor):
    """``VectorStoreIndex(objects=[IndexNode(obj=retriever)])``: plain's ``retrieve`` sets the
    query's embedding on the caller's ``QueryBundle`` (``aretrieve`` does not) and reaches the
    object with that bundle; an async call reaches it through its async methods
    (``aretrieve``). Teola: the same bundles, the same retriever spans, the same nodes."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
    from llama_index.core.schema import IndexNode

    names: list[str] = []

    class Opened(BaseSpanHandler):
        @classmethod
        def class_name(cls) -> str:
            return "Opened"

        def new_span(self, id_, bound_args, instance=None, parent_span_id=None, tags=None, **kwargs):
            if id_.startswith("VectorIndexRetriever"):
                names.append(id_.split("-")[0])

        def prepare_to_exit_span(self, *args, **kwargs):
            return None

        def prepare_to_drop_span(self, *args, **kwargs):
            return None

    embed = TeolaEmbedding(runtime=runtime)
    passages = datasets.load_corpus("squad-xquad-en")[:4]
    inner = VectorStoreIndex.from_documents([Document(text=p.text, id_=p.id) for p in passages], embed_model=embed)
    top = VectorStoreIndex(objects=[IndexNode(text=passages[0].title, index_id="inner",
                                              obj=inner.as_retriever(similarity_top_k=2))], embed_model=embed)
    retriever = top.as_retriever(similarity_top_k=1)
    assert executor.traced(retriever).opaque == []
    opened = Opened()
    get_dispatcher().span_handlers.append(opened)
    try:
        seen = {}
        for side in ("plain", "teola"):
            Settings.executor = executor if side == "teola" else None
            bundles = [QueryBundle(QUESTIONS[0]), QueryBundle(QUESTIONS[0])]
            names.clear()
            nodes = retriever.retrieve(bundles[0])
            sync_spans = list(names)
            names.clear()
            anodes = asyncio.run(retriever.aretrieve(bundles[1]))
            seen[side] = (ids(nodes), ids(anodes), sync_spans, list(names),
                          [len(b.embedding or []) for b in bundles], bundles[0].embedding)
    finally:
        Settings.executor = None
        get_dispatcher().span_handlers.remove(opened)
    plain, teola = seen["plain"], seen["teola"]
    assert teola[:5] == plain[:5] and plain[0]
    assert plain[3].count("VectorIndexRetriever.aretrieve") == 2 and plain[4] == [384, 0]
    assert teola[5] == pytest.approx(plain[5], abs=1e-5)
