"""Apps as the frameworks' docs write them, against a real vLLM OpenAI-compatible server.

LlamaIndex ``OpenAILike`` (chat and completion modes) and LangChain ``ChatOpenAI`` reach the
session's server (``tests/fixtures_served.py``) through a loopback proxy that records every
request body. Plain and Teola runs must send the same bodies (as multisets: Teola's
concurrent calls may arrive in another order), return the same answers and sources, and
lower every LLM call (nothing opaque). Errors reach the caller as plain's exception types.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import openai
import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler

from teola_plugin import datasets
from tests.fixtures_served import SERVED_NAME, docs_rag_chain, free_port
from tests.test_served_calls import relayed
from tests.test_llama_index import QUESTIONS, executor, plain_settings  # noqa: F401

pytestmark = pytest.mark.slow


def plain_gets_teolas_replies(proxy) -> None:
    """Plain, run after Teola, gets Teola's reply to each identical request. Teola's warm-up
    left the server's cache holding the prompt's early part: the same prompt read partly from
    the cache (Teola) and recomputed around the cached blocks of Teola's own full request
    (plain, after) rounds differently on the CPU kernels, which can flip a greedy token. The
    requests are compared; the answers are then built from the same replies."""
    proxy.replay = True


def bodies(requests: list[tuple[str, dict]]) -> list[str]:
    return sorted(json.dumps([path, body], sort_keys=True) for path, body in requests)


def served_engines(graph) -> set[str]:
    return {p.engine for p in graph.nodes if p.op.value in ("llm_prefill", "llm_decode")}


@pytest.fixture(scope="module")
def embed_model():
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.engines.embedder import default_model_path

    return HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")


@pytest.fixture(scope="module")
def squad_index(embed_model):
    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:12]]
    return VectorStoreIndex.from_documents(docs, embed_model=embed_model)


def openai_like(base_url: str, **kwargs):
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(model=SERVED_NAME, api_base=base_url, api_key="none", **{"temperature": 0.0, "max_tokens": 24,
                                                                               **kwargs})


@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_openai_like_query_engine_sends_plain_requests_and_answers_alike(
        mode, recording_proxy, squad_index, executor):
    llm = openai_like(recording_proxy.base_url, is_chat_model=mode == "chat", context_window=2048)
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=2, response_mode="tree_summarize")
    specs_before = dict(executor.runtime.specs)
    app = executor.traced(engine)
    assert app.opaque == [], [str(n) for n in app.opaque]
    # Tracing records the engines the graph needs and registers nothing; the run provides them.
    assert executor.runtime.specs == specs_before
    (served,) = app.engines.served
    assert served.startswith("served:127.0.0.1:") and served not in executor.runtime.specs
    (store,) = app.engines.local
    assert app.engines.local[store].owner is squad_index.vector_store
    recording_proxy.replay = True  # tree_summarize's first calls overlap under Teola: plain's replies
    spans, root = SimpleSpanHandler(), get_dispatcher()
    root.add_span_handler(spans)
    span_names = []
    for question in QUESTIONS[:2]:
        spans.completed_spans.clear()
        plain = engine.query(question)
        sent_plain = recording_proxy.take()
        span_names.append({s.id_.rsplit("-", 5)[0] for s in spans.completed_spans})
        spans.completed_spans.clear()
        teola = executor.query(engine, question)
        sent_teola = recording_proxy.take()
        # lowered steps open fewer spans than plain's own code, never others (reading the
        # synthesizer's prompts opened its _get_prompts / _get_prompt_modules spans)
        assert {s.id_.rsplit("-", 5)[0] for s in spans.completed_spans} <= span_names[-1]
        assert str(teola) == str(plain) and str(plain)
        assert [n.node.node_id for n in teola.source_nodes] == [n.node.node_id for n in plain.source_nodes]
        path = "/v1/chat/completions" if mode == "chat" else "/v1/completions"
        assert sent_plain and {p for p, _ in sent_plain} == {path}
        assert bodies(sent_teola) == bodies(sent_plain)
    root.span_handlers.remove(spans)
    started = {name for name, spec in executor.runtime.specs.items()
               if spec.kwargs.get("base_url") == recording_proxy.base_url and name in executor.runtime.local_engines()}
    assert started == {served} and store in executor.runtime.local_engines()


def test_openai_like_fusion_and_llm_rerank_are_lowered(recording_proxy, squad_index, executor):
    from llama_index.core.postprocessor import LLMRerank
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import QueryFusionRetriever

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
    fusion = QueryFusionRetriever([squad_index.as_retriever(similarity_top_k=2)], llm=llm, num_queries=3,
                                  use_async=False)
    plain_nodes = fusion.retrieve(QUESTIONS[0])
    sent_plain = recording_proxy.take()
    app = executor.traced(fusion)
    assert app.opaque == [] and served_engines(app.graph) and all(e.startswith("served:") for e in served_engines(app.graph))
    teola_nodes = executor.retrieve(fusion, QUESTIONS[0])
    assert [n.node.node_id for n in teola_nodes] == [n.node.node_id for n in plain_nodes]
    assert bodies(recording_proxy.take()) == bodies(sent_plain)

    engine = RetrieverQueryEngine.from_args(squad_index.as_retriever(similarity_top_k=3), llm=llm,
                                            node_postprocessors=[LLMRerank(llm=llm, top_n=2, choice_batch_size=3)])
    assert executor.traced(engine).opaque == []
    plain = engine.query(QUESTIONS[1])
    sent_plain = recording_proxy.take()
    teola = executor.query(engine, QUESTIONS[1])
    assert str(teola) == str(plain)
    assert bodies(recording_proxy.take()) == bodies(sent_plain)


def test_hyde_transform_query_engine_is_lowered_and_answers_alike(recording_proxy, squad_index, executor):
    """LlamaIndex's HyDE pattern: ``TransformQueryEngine(engine, HyDEQueryTransform(llm))``. The
    hypothetical document is one lowered call; the inner engine searches with its embedding and
    the query's (one embed of both strings) and answers the original question."""
    from llama_index.core.indices.query.query_transform import HyDEQueryTransform
    from llama_index.core.query_engine import TransformQueryEngine

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
    engine = TransformQueryEngine(squad_index.as_query_engine(llm=llm, similarity_top_k=2), HyDEQueryTransform(llm=llm))
    app = executor.traced(engine)
    assert app.opaque == [], [str(n) for n in app.opaque]
    assert {n.node for n in app.notes if n.kind == "expands"} >= {"hyde", "transformed_query"}
    recording_proxy.replay = True  # plain's document for Teola's identical request: the same search
    recording_proxy.take()
    for question in QUESTIONS[:2]:
        plain = engine.query(question)
        sent_plain = recording_proxy.take()
        teola = executor.query(engine, question)
        assert len(sent_plain) == 2 and bodies(recording_proxy.take()) == bodies(sent_plain)
        assert str(teola) == str(plain) and str(plain)
        assert [n.node.node_id for n in teola.source_nodes] == [n.node.node_id for n in plain.source_nodes]


def test_chat_openai_chain_returns_invokes_message(recording_proxy, runtime):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                       max_tokens=24, stop=["\n\n"])
    prompt = ChatPromptTemplate.from_messages([("system", "Answer in one sentence."), ("human", "{question}")])
    chain = prompt | model
    teola_chain = TeolaRunnable(chain, runtime=runtime)
    assert teola_chain._plan({"question": "x"}).trace.opaque == []
    for question in QUESTIONS[:2]:
        plain = chain.invoke({"question": question})
        sent_plain = recording_proxy.take()
        teola = teola_chain.invoke({"question": question})
        assert bodies(recording_proxy.take()) == bodies(sent_plain)
        assert type(teola) is type(plain) and teola.content == plain.content
        assert teola.usage_metadata == plain.usage_metadata
        strip = lambda m: {k: v for k, v in m.response_metadata.items() if k != "id"}  # noqa: E731
        assert strip(teola) == strip(plain) and teola.response_metadata["id"].startswith("chatcmpl-")
        assert teola.id.startswith("lc_run--") and teola.additional_kwargs == plain.additional_kwargs
    text_chain = prompt | model | StrOutputParser()
    inputs = [{"question": q} for q in QUESTIONS[:3]]
    recording_proxy.take()
    expected = text_chain.batch(inputs)
    sent_plain = recording_proxy.take()
    # Concurrent requests: vLLM's numerics depend on which share a batch, so Teola's identical
    # requests get plain's replies (the bodies are compared; a different one goes upstream).
    recording_proxy.replay = True
    got = TeolaRunnable(text_chain, runtime=runtime).batch(inputs)
    # StrOutputParser returns the message's .text: langchain-core's TextAccessor, not a bare str
    assert got == expected and [type(x) for x in got] == [type(x) for x in expected]
    assert bodies(recording_proxy.take()) == bodies(sent_plain)

    # output_version="v1" (or LC_OUTPUT_VERSION): the message's content as standard content blocks
    blocks = model.model_copy(update={"output_version": "v1"})
    for v1_chain in (prompt | blocks, prompt | blocks.bind_tools([add_numbers], tool_choice="add_numbers")):
        plain = v1_chain.invoke({"question": QUESTIONS[0]})
        teola = TeolaRunnable(v1_chain, runtime=runtime).invoke({"question": QUESTIONS[0]})
        assert isinstance(plain.content, list) and plain.response_metadata["output_version"] == "v1"
        assert (teola.content, teola.tool_calls, strip(teola)) == (plain.content, plain.tool_calls, strip(plain))


def add_numbers(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_bound_sampling_arguments_are_lowered_with_plains_body_and_logprobs(recording_proxy, runtime):
    """``model.bind(max_tokens=..., logprobs=True, top_logprobs=..., seed=...)`` (LangChain's
    log-probabilities how-to): lowered, the bound arguments in plain's body, the reply's log
    probabilities in the message's ``response_metadata`` as plain's; ``n`` stays the model's call."""
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    recording_proxy.replay = True  # the same request gets plain's reply: its logprobs compared whole
    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                       max_tokens=24)
    prompt = ChatPromptTemplate.from_messages([("human", "{question}")])
    chain = prompt | model.bind(max_tokens=6, logprobs=True, top_logprobs=2, seed=11)
    fast = TeolaRunnable(chain, runtime=runtime)
    x = {"question": QUESTIONS[0]}
    assert fast._plan(x).trace.opaque == []
    plain = chain.invoke(x)
    sent_plain = recording_proxy.take()
    teola = fast.invoke(x)
    assert bodies(recording_proxy.take()) == bodies(sent_plain)
    body = sent_plain[0][1]
    assert (body["max_completion_tokens"], body["logprobs"], body["top_logprobs"], body["seed"]) == (6, True, 2, 11)
    assert teola.content == plain.content and teola.usage_metadata == plain.usage_metadata
    logprobs = plain.response_metadata["logprobs"]["content"]
    assert len(logprobs) >= 1 and len(logprobs[0]["top_logprobs"]) == 2
    assert teola.response_metadata["logprobs"] == plain.response_metadata["logprobs"]
    (note,) = TeolaRunnable(prompt | model.bind(n=2), runtime=runtime)._plan(x).trace.opaque
    assert "['n']" in note.reason


def test_a_model_configured_per_call_runs_as_it_is_with_each_calls_config(recording_proxy, runtime):
    """``configurable_alternatives`` / ``configurable_fields``: the model is chosen by the
    call's config, so it runs as it is (its request still relayed by Teola's served engine),
    the parser after it lowered; each call sends the request plain sends for that config."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import ConfigurableField
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    def model(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                          max_tokens=max_tokens)

    short = model(4).configurable_fields(max_tokens=ConfigurableField(id="max_tokens"))
    chosen = short.configurable_alternatives(ConfigurableField(id="llm"), default_key="short", longer=model(12))
    chain = ChatPromptTemplate.from_messages([("human", "{question}")]) | chosen | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    x = {"question": QUESTIONS[0]}
    assert {o.component for o in fast._plan(x).trace.opaque} == {"RunnableConfigurableAlternatives"}
    recording_proxy.take()
    for configurable in ({}, {"llm": "longer"}, {"max_tokens": 7}):
        config = {"configurable": configurable}
        plain = chain.invoke(x, config)
        sent_plain = recording_proxy.take()
        before = relayed(runtime)
        assert fast.invoke(x, config) == plain
        assert relayed(runtime) - before == 1  # the model's own request, sent by Teola's served engine
        sent = recording_proxy.take()
        assert bodies(sent) == bodies(sent_plain)
        assert sent_plain[0][1]["max_completion_tokens"] == {"llm": 12, "max_tokens": 7}.get(next(iter(configurable), ""), 4)


def test_unreproducible_chat_openai_stays_opaque_with_the_reason(model_server, runtime):
    import httpx
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    custom = ChatOpenAI(model=SERVED_NAME, base_url=model_server.base_url, api_key="none",
                        http_async_client=httpx.AsyncClient(), http_client=httpx.Client())
    (note,) = TeolaRunnable(custom, runtime=runtime)._plan("hi").trace.opaque
    assert "http_client" in note.reason
    streaming = ChatOpenAI(model=SERVED_NAME, base_url=model_server.base_url, api_key="none", streaming=True)
    (note,) = TeolaRunnable(streaming, runtime=runtime)._plan("hi").trace.opaque
    assert "streaming=True" in note.reason


def test_a_model_behind_an_llm_cache_or_a_rate_limiter_runs_as_plain(recording_proxy, runtime):
    """LangChain's cache (``set_llm_cache``, or the model's own) answers a repeated call with no
    request, and a ``rate_limiter`` holds requests back: such a model's call runs as it is,
    with plain's requests and cache contents; a plan traced before ``set_llm_cache`` is traced
    again, and one traced after it is dropped is lowered again."""
    from langchain_core.caches import InMemoryCache
    from langchain_core.globals import get_llm_cache, set_llm_cache
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.rate_limiters import InMemoryRateLimiter
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    def model(**kwargs) -> ChatOpenAI:
        return ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                          max_tokens=8, **kwargs)

    prompt = ChatPromptTemplate.from_messages([("human", "{question}")])
    chain = prompt | model() | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    x = {"question": QUESTIONS[0]}
    assert fast._plan(x).trace.opaque == []
    recording_proxy.take()
    try:
        sent, caches, answers = [], [], []
        for run in (chain, fast):
            set_llm_cache(InMemoryCache())
            answers.append([run.invoke(x), run.invoke(x)])
            sent.append(recording_proxy.take())
            caches.append([[g.text for g in generations] for generations in get_llm_cache()._cache.values()])
        assert len(sent[0]) == 1 and bodies(sent[1]) == bodies(sent[0])  # the second call was a cache hit
        assert answers[1] == answers[0] and caches[1] == caches[0]
        (note,) = fast._plan(x).trace.opaque
        assert "cache" in note.reason
    finally:
        set_llm_cache(None)
    assert fast._plan(x).trace.opaque == []
    own_cache = prompt | model(cache=InMemoryCache()) | StrOutputParser()
    assert "cache" in TeolaRunnable(own_cache, runtime=runtime)._plan(x).trace.opaque[0].reason
    assert TeolaRunnable(prompt | model(cache=False), runtime=runtime)._plan(x).trace.opaque == []

    limiter = InMemoryRateLimiter(requests_per_second=100, check_every_n_seconds=0.01)
    limited = TeolaRunnable(prompt | model(rate_limiter=limiter) | StrOutputParser(), runtime=runtime)
    (note,) = limited._plan(x).trace.opaque
    assert "rate_limiter" in note.reason
    assert limited.invoke(x) == answers[0][0] and limiter.last is not None  # it waited on the limiter
    assert bodies(recording_proxy.take()) == bodies(sent[0])


def _raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 — the type is what is compared
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize("failure", ["refused", "context_too_long", "timeout"])
def test_server_errors_reach_the_caller_as_plain_raises_them(failure, model_server, squad_index, executor, runtime):
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    base_url = f"http://127.0.0.1:{free_port()}/v1" if failure == "refused" else model_server.base_url
    max_tokens = 1500 if failure == "timeout" else 24
    # A reply of max_tokens tokens (vLLM's min_tokens) takes seconds on any machine: past the timeout.
    generates_long = {"extra_body": {"min_tokens": max_tokens}} if failure == "timeout" else {}
    options = {"timeout": 0.5} if failure == "timeout" else {}
    question = QUESTIONS[0] + (" word" * 2500 if failure == "context_too_long" else "")
    expected = {"refused": openai.APIConnectionError, "context_too_long": openai.BadRequestError,
                "timeout": openai.APITimeoutError}[failure]

    llm = openai_like(base_url, is_chat_model=True, context_window=100_000, max_retries=0,
                      additional_kwargs=generates_long, **options)
    llm.max_tokens = max_tokens
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=1)
    plain = _raised(lambda: engine.query(question))
    teola = _raised(lambda: executor.query(engine, question))
    assert isinstance(plain, expected) and type(teola) is type(plain)
    assert any(base_url in note for note in getattr(teola, "__notes__", []))

    model = ChatOpenAI(model=SERVED_NAME, base_url=base_url, api_key="none", max_tokens=max_tokens, max_retries=0,
                       **generates_long, **options)
    plain = _raised(lambda: model.invoke(question))
    teola = _raised(lambda: TeolaRunnable(model, runtime=runtime).invoke(question))
    assert type(teola) is type(plain)
    # the engine serves the next query normally
    if failure != "refused":
        ok = openai_like(model_server.base_url, is_chat_model=True, context_window=2048)
        assert str(executor.query(squad_index.as_query_engine(llm=ok, similarity_top_k=1), QUESTIONS[1]))


def test_a_server_that_never_answers_fails_the_first_call_about_when_the_clients_timeout_says(squad_index,
                                                                                              executor):
    """A model object with a short ``timeout`` against a server that accepts connections and
    never answers: plain raises ``APITimeoutError`` after the timeout. So does Teola's first call,
    whose new served engine probes the server's features first: the probes wait no longer than
    the client's own timeout (they waited 5 s each, so the first call took ~10x the timeout)."""
    import socket
    import threading

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    held: list = []
    threading.Thread(target=lambda: [held.append(silent.accept()) for _ in iter(int, 1)], daemon=True).start()
    base_url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
    try:
        engine = squad_index.as_query_engine(llm=openai_like(base_url, is_chat_model=True, context_window=2048,
                                                             timeout=0.5, max_retries=0), similarity_top_k=1)
        plain = _raised(lambda: engine.query(QUESTIONS[0]))
        began = time.monotonic()
        teola = _raised(lambda: executor.query(engine, QUESTIONS[0]))
        took = time.monotonic() - began
        assert isinstance(plain, openai.APITimeoutError) and type(teola) is type(plain)
        assert took < 4.0, f"the first call took {took:.1f} s with a 0.5 s client timeout"
    finally:
        silent.close()


def test_a_rejected_lowered_call_reports_plains_callback_events(model_server, squad_index, executor):
    """The server rejects the answer's call (404: no such model): plain's LLM decorator ends the
    call's ``LLM`` event with the exception and its ``as_trace`` adds an ``EXCEPTION`` event; the
    events around it end without one (``CallbackManager.event``'s ``event_added``), and
    ``TokenCountingHandler`` counts a (0, 0) call. The same events under Teola."""
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler, TokenCountingHandler

    def events_of(run) -> tuple:
        debug, tokens = LlamaDebugHandler(), TokenCountingHandler()
        llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_retries=0)
        llm.model = "no-such-model"
        engine = squad_index.as_query_engine(llm=llm, similarity_top_k=1)
        engine.callback_manager = CallbackManager([debug, tokens])
        llm.callback_manager = engine.callback_manager
        error = _raised(lambda: run(engine))
        seen = [(e.event_type.value, sorted(str(k) for k in (e.payload or {}))) for e in debug.get_events()]
        return (type(error).__name__, getattr(error, "event_added", None), seen,
                [(c.prompt_token_count, c.completion_token_count) for c in tokens.llm_token_counts])

    plain = events_of(lambda engine: engine.query(QUESTIONS[0]))
    teola = events_of(lambda engine: executor.query(engine, QUESTIONS[0]))
    assert plain[0] == "NotFoundError" and ("exception", ["EventPayload.EXCEPTION"]) in plain[2]
    assert teola == plain


@pytest.mark.parametrize("fault", ["500", "drop"])
def test_a_failed_or_cut_off_reply_and_a_restarted_server_behave_as_plain(fault, recording_proxy, squad_index,
                                                                          executor, runtime):
    """The server fails a request (HTTP 500) or dies mid-reply (the connection ends halfway
    through the body, a stream included), then restarts on its port: each call raises what
    plain raises, nothing hangs, and the next query after the restart is answered."""
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_retries=0)
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=1)
    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", max_tokens=16,
                       temperature=0, max_retries=0)

    def streamed(runnable) -> str:
        return "".join(chunk.content for chunk in runnable.stream(QUESTIONS[0]))

    for plain_call, teola_call in [
        (lambda: engine.query(QUESTIONS[0]), lambda: executor.query(engine, QUESTIONS[0])),
        (lambda: model.invoke(QUESTIONS[0]), lambda: TeolaRunnable(model, runtime=runtime).invoke(QUESTIONS[0])),
        (lambda: streamed(model), lambda: streamed(TeolaRunnable(model, runtime=runtime))),
    ]:
        recording_proxy.fault = fault
        plain = _raised(plain_call)
        recording_proxy.fault = fault
        teola = _raised(teola_call)
        assert type(teola) is type(plain) and isinstance(plain, (openai.APIError, httpx.HTTPError)), (plain, teola)

    recording_proxy.stop()  # the server is down: plain's error, from Teola too
    plain, teola = _raised(lambda: engine.query(QUESTIONS[1])), _raised(lambda: executor.query(engine, QUESTIONS[1]))
    assert isinstance(plain, openai.APIConnectionError) and type(teola) is type(plain)
    recording_proxy.start()  # back on its port: the served engine's client reconnects
    assert str(executor.query(engine, QUESTIONS[1])) == str(engine.query(QUESTIONS[1]))


def test_a_failed_lowered_call_reports_on_llm_error_as_plain(recording_proxy, runtime):
    """Callbacks of a lowered call that fails: ``on_chat_model_start``, then ``on_llm_error``
    with the model's own exception and its HTTP status in the generation, as plain reports."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    class Heard(BaseCallbackHandler):
        def __init__(self) -> None:
            self.events: list = []

        def on_chat_model_start(self, serialized, messages, **kwargs) -> None:
            self.events.append(("start", messages[0][-1].content))

        def on_llm_end(self, response, **kwargs) -> None:
            self.events.append(("end", response.generations[0][0].text))

        def on_llm_error(self, error, **kwargs) -> None:
            (generation,) = kwargs["response"].generations[0]
            self.events.append(("error", type(error).__name__, generation.message.response_metadata["status_code"]))

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", max_tokens=8,
                       temperature=0, max_retries=0)
    chain = ChatPromptTemplate.from_template("Answer briefly: {q}") | model | StrOutputParser()
    teola = TeolaRunnable(chain, runtime=runtime)
    assert teola._plan({"q": "x"}).trace.opaque == []
    heard = []
    for run in (chain.invoke, teola.invoke):
        handler = Heard()
        recording_proxy.fault = "500"
        with pytest.raises(openai.InternalServerError):
            run({"q": QUESTIONS[0]}, config={"callbacks": [handler]})
        run({"q": QUESTIONS[0]}, config={"callbacks": [handler]})  # and the next call ends as plain's
        heard.append(handler.events)
    assert heard[1] == heard[0] and [e[0] for e in heard[0]] == ["start", "error", "start", "end"], heard
    assert heard[0][1][2] == 500  # LangChain's own error type (its translation of the SDK's), the server's status


def test_a_partial_prefill_fills_the_servers_prefix_cache_for_the_full_request(model_server):
    """Prefill splitting's request: the prompt with one token to generate (a vLLM ``min_tokens``
    the request carries is left out of it, or one token would be a bad request); the full
    request then finds the prompt in the server's prefix cache."""
    from teola_plugin.engines.llm_served import OpenAICompatibleEngine

    async def run():
        engine = OpenAICompatibleEngine(model_server.base_url, api_key="none", max_retries=0)
        await engine.start()
        try:
            body = {"model": SERVED_NAME, "max_tokens": 4, "temperature": 0.0, "extra_body": {"min_tokens": 4},
                    "messages": [{"role": "user", "content": f"Prefix caching test {uuid.uuid4()}. " * 30
                                  + QUESTIONS[2]}]}  # a prompt no earlier run left in the cache
            prefilled = await engine.prefill(body)
            generation = await engine.generate(body)
            return prefilled, generation
        finally:
            await engine.close()

    prefilled, generation = asyncio.run(run())
    assert prefilled.num_prompt_tokens == generation.num_prompt_tokens > 200
    # whole KV blocks are cached (vLLM CPU: 128 tokens a block); the prompt had none before
    assert prefilled.num_cached_tokens == 0 and generation.num_cached_tokens >= 128
    assert generation.response.usage.completion_tokens == 4


def fresh_system_prompt() -> str:
    """A ~300-token system message no earlier request left in the server's prefix cache."""
    return (f"Session {uuid.uuid4()}. You answer questions about the given context in one short "
            "sentence, without adding facts the context does not state. " * 12)


def test_a_servers_prefix_cache_is_detected_and_a_chat_prompts_prefix_warmed_up(recording_proxy, runtime):
    """Prefill splitting on a model server, as users write the chain (a chat template with a
    long system prompt, ``ChatOpenAI``): declined while the server's prefix cache is unknown;
    once its engine detected it (vLLM's metrics: on, 128-token blocks on the CPU), the
    warm-up is the framework's own request body cut before the retrieved context, with one
    token to generate, and the full request (plain's body) finds the prefix in the cache."""
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_core.runnables import RunnablePassthrough
    from langchain_huggingface import HuggingFaceEmbeddings
    from langchain_openai import ChatOpenAI

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.langchain import TeolaRunnable
    from teola_plugin.optimizer.cost import CostModel

    system = fresh_system_prompt()
    prompt = ChatPromptTemplate.from_messages([("system", system),
                                               ("human", "Question: {question}\nContext:\n{context}\nAnswer:")])
    store = InMemoryVectorStore.from_texts([p.text for p in datasets.load_corpus("squad-xquad-en")[:8]],
                                           HuggingFaceEmbeddings(model_name=str(default_model_path())))
    llm = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                     max_tokens=8)
    chain = {"context": store.as_retriever(search_kwargs={"k": 1}) | (lambda docs: docs[0].page_content),
             "question": RunnablePassthrough()} | prompt | llm

    unknown = TeolaRunnable(chain, runtime=runtime)
    assert "not known to cache prefixes" in unknown.explain(QUESTIONS[0])
    unknown.invoke(QUESTIONS[0])  # starts the server's engine, which asks the server's metrics
    (served,) = [name for name in runtime.local_engines() if name.startswith("served:") and
                 runtime.local_engines()[name].base_url == recording_proxy.base_url]
    cache = runtime.local_engines()[served].prefix_cache
    assert (cache.enabled, cache.block_tokens) == (True, 128), cache.how
    assert runtime.cost_model().prefix_cache(served) == cache
    # the plan made before the detection is made again with what the runtime knows now
    assert "not known to cache prefixes" not in unknown.explain(QUESTIONS[0])
    assert unknown._plan(QUESTIONS[0]).cost is runtime.cost_model()

    # the unlimited-engines model (retrieval elsewhere), so that the warm-up pays off
    warmed = TeolaRunnable(chain, runtime=runtime, cost_model=CostModel.default().with_prefix_caches({served: cache}))
    assert "prefilled early" in warmed.explain(QUESTIONS[1])
    recording_proxy.take()
    teola = warmed.invoke(QUESTIONS[1])
    sent_teola = [b for path, b in recording_proxy.take() if path == "/v1/chat/completions"]
    plain_gets_teolas_replies(recording_proxy)
    plain = chain.invoke(QUESTIONS[1])
    sent_plain = [b for path, b in recording_proxy.take() if path == "/v1/chat/completions"]
    (warm_up,) = [b for b in sent_teola if b.get("max_tokens") == 1]
    (full,) = [b for b in sent_teola if b is not warm_up]
    assert [full] == sent_plain  # the framework's own request, unchanged
    system_msg, human = warm_up["messages"]
    assert system_msg == full["messages"][0] and human["content"] == f"Question: {QUESTIONS[1]}\nContext:\n"
    length = ("messages", "max_tokens", "max_completion_tokens", "stream")  # the rest is the request's own
    assert {k: v for k, v in warm_up.items() if k not in length} == {k: v for k, v in full.items() if k not in length}
    assert teola.usage_metadata["input_token_details"]["cache_read"] >= 128  # the warm-up's blocks
    assert teola.content == plain.content


def test_a_llama_index_synthesis_prompts_early_part_is_warmed_on_the_server(recording_proxy, squad_index,
                                                                            executor):
    """LlamaIndex packs its synthesis prompts at run time; the synthesize step carries its QA
    template (``warm_prompt``), so split_prefill warms the part before the retrieved text:
    LlamaIndex's own request (its chat template, system message included) cut there, with
    one token to generate. The full request and the answer are plain's."""
    from llama_index.core import ChatPromptTemplate
    from llama_index.core.llms import ChatMessage

    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.optimizer.cost import CostModel

    system = fresh_system_prompt()
    qa = ChatPromptTemplate([ChatMessage(role="system", content=system),
                             ChatMessage(role="user", content="Question: {query_str}\nContext:\n{context_str}\nAnswer:")])
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=8)
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=1, text_qa_template=qa)
    executor.query(engine, QUESTIONS[0])  # starts the server's engine: it detects the prefix cache
    (served,) = [n for n, e in executor.runtime.local_engines().items()
                 if n.startswith("served:") and e.base_url == recording_proxy.base_url]
    cache = executor.runtime.local_engines()[served].prefix_cache
    # the unlimited-engines model (retrieval elsewhere), so that the warm-up pays off
    warming = TeolaExecutor(executor.runtime, cost_model=CostModel.default().with_prefix_caches({served: cache}))
    assert "prefilled early by synthesize.partial" in warming.explain(engine)
    recording_proxy.take()
    teola = warming.query(engine, QUESTIONS[1])
    sent_teola = [b for path, b in recording_proxy.take() if path == "/v1/chat/completions"]
    plain_gets_teolas_replies(recording_proxy)
    plain = engine.query(QUESTIONS[1])
    sent_plain = [b for path, b in recording_proxy.take() if path == "/v1/chat/completions"]
    (warm_up,) = [b for b in sent_teola if b.get("max_tokens") == 1]
    assert [b for b in sent_teola if b is not warm_up] == sent_plain
    system_msg, user = warm_up["messages"]
    assert system_msg == sent_plain[0]["messages"][0] and user["content"] == f"Question: {QUESTIONS[1]}\nContext:\n"
    assert str(teola) == str(plain)
    assert [n.node.node_id for n in teola.source_nodes] == [n.node.node_id for n in plain.source_nodes]


def test_streamed_calls_send_plains_streaming_request_and_stream_its_tokens(recording_proxy, squad_index, executor,
                                                                            runtime):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                       max_tokens=24)
    chain = ChatPromptTemplate.from_messages([("human", "{question}")]) | model | StrOutputParser()
    question = {"question": QUESTIONS[0]}
    plain = list(chain.stream(question))
    sent_plain = recording_proxy.take()
    teola = list(TeolaRunnable(chain, runtime=runtime).stream(question))
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain[0][1]["stream"] is True
    assert teola == plain and len(teola) > 1  # chunk for chunk, the empty role and finish chunks too

    # the model's own chunks: the server's finish reason, usage (stream_usage) and last-chunk marker
    usage_model = model.model_copy(update={"stream_usage": True})
    messages = ChatPromptTemplate.from_messages([("human", "{question}")]) | usage_model

    def merged(chunks: list) -> tuple:
        total = chunks[0]
        for c in chunks[1:]:
            total = total + c
        return (total.content, total.response_metadata, total.usage_metadata,
                [(c.content, c.chunk_position) for c in chunks])

    plain_chunks = list(messages.stream(question))
    teola_chunks = list(TeolaRunnable(messages, runtime=runtime).stream(question))
    assert merged(teola_chunks) == merged(plain_chunks) and merged(plain_chunks)[2]  # usage came
    recording_proxy.take()

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=2, streaming=True)
    assert executor.traced(engine).opaque == []
    plain = engine.query(QUESTIONS[1])
    plain_tokens = list(plain.response_gen)
    sent_plain = recording_proxy.take()
    streamed = executor.query(engine, QUESTIONS[1])
    time.sleep(1)
    assert recording_proxy.take() == []  # as plain's, the model request waits for the stream to be read
    tokens = list(streamed.response_gen)
    # token for token: one per chunk of the server's, its empty role chunk first, no token of Teola's own
    assert type(streamed) is type(plain) and tokens == plain_tokens and len(tokens) > 1 and plain_tokens[0] == ""
    assert [n.node.node_id for n in streamed.source_nodes] == [n.node.node_id for n in plain.source_nodes]
    assert bodies(recording_proxy.take()) == bodies(sent_plain)

    async def async_tokens(query) -> list[str]:
        recording_proxy.take()
        response = await query(engine, QUESTIONS[1])
        await asyncio.sleep(1)
        assert recording_proxy.take() == []  # nothing sent before the stream is read
        return [t async for t in response.async_response_gen()]

    assert asyncio.run(async_tokens(executor.aquery)) == asyncio.run(async_tokens(lambda e, q: e.aquery(q))) \
        == plain_tokens
    recording_proxy.take()
    completion = squad_index.as_query_engine(llm=openai_like(recording_proxy.base_url, is_chat_model=False,
                                                             context_window=2048), similarity_top_k=2, streaming=True)
    plain_tokens = list(completion.query(QUESTIONS[1]).response_gen)
    assert list(executor.query(completion, QUESTIONS[1]).response_gen) == plain_tokens and len(plain_tokens) > 1
    recording_proxy.take()

    # a streaming refine streams every call, the steps it reads itself too: plain's requests
    refine = squad_index.as_query_engine(llm=llm.model_copy(update={"max_tokens": 12}), similarity_top_k=2,
                                         response_mode="refine", streaming=True)
    plain_text = "".join(refine.query(QUESTIONS[1]).response_gen)
    sent_plain = recording_proxy.take()
    assert len(sent_plain) > 1 and all(body["stream"] is True for _, body in sent_plain)
    assert "".join(executor.query(refine, QUESTIONS[1]).response_gen) == plain_text
    assert bodies(recording_proxy.take()) == bodies(sent_plain)


@pytest.mark.parametrize("embeddings_module", ["langchain_huggingface", "langchain_community.embeddings"])
def test_langchain_rag_as_the_docs_write_it_is_lowered_and_answers_alike(embeddings_module, recording_proxy,
                                                                         runtime):
    import importlib
    import warnings

    from langchain_classic.retrievers.multi_query import MultiQueryRetriever
    from langchain_core.vectorstores import InMemoryVectorStore

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.langchain import TeolaRunnable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the community class is deprecated
        embeddings = importlib.import_module(embeddings_module).HuggingFaceEmbeddings(
            model_name=str(default_model_path()))
    store = InMemoryVectorStore.from_texts([p.text for p in datasets.load_corpus("squad-xquad-en")[:16]], embeddings)
    retriever = store.as_retriever(search_kwargs={"k": 2})
    chain = docs_rag_chain(retriever, recording_proxy.base_url)
    llm = chain.steps[-2]  # its ChatOpenAI
    teola = TeolaRunnable(chain, runtime=runtime)
    graph = teola.trace(QUESTIONS[0])
    assert {p.op.value for p in graph.nodes} >= {"embed", "vector_search", "llm_prefill", "llm_decode"}
    assert [o.component for o in teola._plan(QUESTIONS[0]).trace.opaque] == ["format_docs"]
    # an identical request gets the first one's reply: a prompt decoded again over a cached
    # prefix can pick another greedy token on bf16 CPU kernels (the bodies are what is compared)
    recording_proxy.replay = True
    for question in QUESTIONS[:2] + ["A question\nover two lines?"]:
        recording_proxy.take()
        got = teola.invoke(question)
        sent = recording_proxy.take()
        assert got == chain.invoke(question) and bodies(recording_proxy.take()) == bodies(sent)
    multi = MultiQueryRetriever.from_llm(retriever=retriever, llm=llm)
    assert TeolaRunnable(multi, runtime=runtime)._plan(QUESTIONS[0]).trace.opaque == []
    recording_proxy.take()
    plain_docs = multi.invoke(QUESTIONS[0])
    sent_plain = recording_proxy.take()
    teola_docs = TeolaRunnable(multi, runtime=runtime).invoke(QUESTIONS[0])
    assert bodies(recording_proxy.take()) == bodies(sent_plain)
    assert sorted(d.page_content for d in teola_docs) == sorted(d.page_content for d in plain_docs)

    prompted = importlib.import_module(embeddings_module).HuggingFaceEmbeddings(
        model_name=str(default_model_path()), encode_kwargs={"prompt": "query: "})
    other = InMemoryVectorStore(prompted).as_retriever()
    (note,) = TeolaRunnable(other, runtime=runtime)._plan("q").trace.opaque
    assert "encode_kwargs ['prompt']" in note.reason
    if embeddings_module == "langchain_huggingface":  # the reason names the field the query's kwargs come from
        query_prompted = importlib.import_module(embeddings_module).HuggingFaceEmbeddings(
            model_name=str(default_model_path()), query_encode_kwargs={"prompt": "query: "})
        query_retriever = InMemoryVectorStore(query_prompted).as_retriever()
        (note,) = TeolaRunnable(query_retriever, runtime=runtime)._plan("q").trace.opaque
        assert "HuggingFaceEmbeddings query_encode_kwargs ['prompt']" in note.reason


def test_retrieval_chain_helpers_are_lowered_and_stream_plains_chunks(recording_proxy, runtime):
    """``create_retrieval_chain`` / ``create_stuff_documents_chain`` /
    ``create_history_aware_retriever`` as LangChain's docs write them: nothing is opaque (their
    own document formatting and input picking run as they are, LangChain's glue, not reported);
    same answer and context; a dict output streams as
    plain's does (``input``, then ``context``, then the answer's tokens, as AddableDicts)."""
    from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.utils import AddableDict
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_huggingface import HuggingFaceEmbeddings
    from langchain_openai import ChatOpenAI

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.langchain import TeolaRunnable

    embeddings = HuggingFaceEmbeddings(model_name=str(default_model_path()))
    store = InMemoryVectorStore.from_texts([p.text for p in datasets.load_corpus("squad-xquad-en")[:16]], embeddings)
    retriever = store.as_retriever(search_kwargs={"k": 2})
    llm = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                     max_tokens=12)
    answer_prompt = ChatPromptTemplate.from_messages([("system", "Answer from the context:\n\n{context}"),
                                                      ("human", "{input}")])
    rephrase = ChatPromptTemplate.from_messages([MessagesPlaceholder("chat_history"), ("human", "{input}"),
                                                 ("human", "Write a search query for the question.")])
    answer_docs = create_stuff_documents_chain(llm, answer_prompt)
    history_aware = create_retrieval_chain(create_history_aware_retriever(llm, retriever, rephrase), answer_docs)
    fast = TeolaRunnable(history_aware, runtime=runtime)
    first = {"input": QUESTIONS[0], "chat_history": []}
    follow_up = {"input": "And when?", "chat_history": [("human", QUESTIONS[0]), ("ai", "I do not know.")]}
    for turn in (first, follow_up):  # its branch, chosen at run time: no rephrasing, then rephrasing
        plain = history_aware.invoke(turn)
        assert fast._plan(turn).trace.opaque == []
        got = fast.invoke(turn)
        assert got["answer"] == plain["answer"] and got["context"] == plain["context"]

    chain = create_retrieval_chain(retriever, answer_docs)
    fast = TeolaRunnable(chain, runtime=runtime)
    assert {p.op.value for p in fast.trace(first).nodes} >= {"embed", "vector_search", "llm_decode"}
    assert fast._plan(first).trace.opaque == []
    plain = chain.invoke(first)
    plain_chunks, chunks = list(chain.stream(first)), list(fast.stream(first))
    assert all(type(c) is AddableDict for c in chunks)
    assert [sorted(c) for c in chunks[:2]] == [sorted(c) for c in plain_chunks[:2]]  # the input's keys, the context
    assert len([c for c in chunks if "answer" in c]) > 3  # token by token
    plain_answer = "".join(c["answer"] for c in plain_chunks if "answer" in c)
    assert "".join(c["answer"] for c in chunks if "answer" in c) == plain_answer
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged == {**first, "context": plain["context"], "answer": plain_answer}


def test_llm_document_compressors_ask_about_every_document_at_once_with_plains_requests(recording_proxy, runtime):
    """LangChain's contextual-compression docs: ``LLMChainExtractor`` (one ``invoke`` per
    document, one after another, in plain) and ``LLMChainFilter`` (``batch``) under a
    ``ContextualCompressionRetriever``: nothing opaque, every document's chain call expanded
    at once; the same request bodies, documents, callback runs (each chain run a child of the
    retriever's) and (where a call's parse fails) the first document's error, as plain raises it."""
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_classic.retrievers.document_compressors import LLMChainExtractor, LLMChainFilter
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_huggingface import HuggingFaceEmbeddings
    from langchain_openai import ChatOpenAI

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.langchain import TeolaRunnable

    class Runs(BaseCallbackHandler):
        """Each run: its kind, name, tags and its parent run's name."""

        def __init__(self) -> None:
            self.started: list[tuple] = []
            self.names: dict = {}

        def _start(self, kind: str, name: str, kwargs: dict) -> None:
            self.names[kwargs["run_id"]] = name
            self.started.append((kind, name, tuple(sorted(kwargs.get("tags") or [])), kwargs.get("parent_run_id")))

        @property
        def runs(self) -> list[tuple]:
            return [(*run[:3], str(self.names.get(run[3]))) for run in self.started]

        def on_chain_start(self, serialized, inputs, **kwargs) -> None:
            self._start("chain", kwargs.get("name"), kwargs)

        def on_chat_model_start(self, serialized, messages, **kwargs) -> None:
            self._start("model", "ChatOpenAI", kwargs)

        def on_retriever_start(self, serialized, query, **kwargs) -> None:
            self._start("retriever", kwargs.get("name"), kwargs)

    embeddings = HuggingFaceEmbeddings(model_name=str(default_model_path()))
    store = InMemoryVectorStore.from_texts([p.text for p in datasets.load_corpus("squad-xquad-en")[:16]], embeddings)
    wide = store.as_retriever(search_kwargs={"k": 3})
    recording_proxy.replay = True  # Teola's concurrent calls get plain's replies to the same requests
    question = QUESTIONS[0]

    def llm(**kwargs) -> ChatOpenAI:
        return ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                          max_tokens=24, **kwargs)

    # the filter's yes / no, valid by construction (vLLM's structured outputs, in both bodies)
    yes_no = llm(extra_body={"structured_outputs": {"choice": ["YES", "NO"]}})
    for compressor in (LLMChainExtractor.from_llm(llm()), LLMChainFilter.from_llm(yes_no)):
        compression = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=wide)
        fast = TeolaRunnable(compression, runtime=runtime)
        assert fast._plan(question).trace.opaque == []
        recording_proxy.take()
        plain_runs, runs = Runs(), Runs()
        plain = compression.invoke(question, config={"callbacks": [plain_runs]})
        sent = recording_proxy.take()
        assert len(sent) == 3  # one call per retrieved document
        got = fast.invoke(question, config={"callbacks": [runs]})
        assert bodies(recording_proxy.take()) == bodies(sent)
        assert got == plain
        assert sorted(runs.runs) == sorted(plain_runs.runs)
        assert ("chain", "RunnableSequence", (), "ContextualCompressionRetriever") in plain_runs.runs
        assert asyncio.run(fast.ainvoke(question)) == asyncio.run(compression.ainvoke(question))

    # a parse that fails: the first document's error, with plain's message
    strict = LLMChainFilter.from_llm(llm())  # free text: BooleanOutputParser wants YES / NO
    compression = ContextualCompressionRetriever(base_compressor=strict, base_retriever=wide)
    with pytest.raises(ValueError) as plain_error:
        compression.invoke(question)
    with pytest.raises(ValueError) as error:
        TeolaRunnable(compression, runtime=runtime).invoke(question)
    assert str(error.value) == str(plain_error.value)


def test_astream_events_reports_each_lowered_calls_tokens_as_plain(recording_proxy, runtime):
    """The LangChain streaming guide's pattern: ``on_chat_model_stream`` events of a lowered
    ``ChatOpenAI``, token by token, from the same streaming request plain sends; every run's
    events (prompt, model, parser, chain) named and tagged as plain's; a plain ``invoke``
    with a callback handler hears no tokens, in both."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    llm = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                     max_tokens=8)
    chain = ChatPromptTemplate.from_template("Tell me about {topic}.") | llm | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast._plan({"topic": "x"}).trace.opaque == []

    async def model_events(runnable) -> tuple[list[str], list[str]]:
        kinds, tokens = [], []
        async for event in runnable.astream_events({"topic": "rain"}, version="v2"):
            if event["name"] == "ChatOpenAI":
                kinds.append(event["event"])
                if event["event"] == "on_chat_model_stream" and event["data"]["chunk"].content:
                    tokens.append(event["data"]["chunk"].content)
        return kinds, tokens

    recording_proxy.take()
    plain_kinds, plain_tokens = asyncio.run(model_events(chain))
    sent_plain = recording_proxy.take()
    kinds, tokens = asyncio.run(model_events(fast))
    assert tokens == plain_tokens and len(tokens) > 3
    assert kinds[0] == "on_chat_model_start" and kinds[-1] == "on_chat_model_end"
    assert set(kinds) == set(plain_kinds)
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain[0][1]["stream"] is True

    async def runs(runnable) -> set[tuple]:  # every run's events, named and tagged (seq:step:N) as plain's
        return {(e["event"], e["name"], tuple(t for t in e["tags"] if t.startswith("seq:")))
                async for e in runnable.astream_events({"topic": "rain"}, version="v2")}

    assert asyncio.run(runs(fast)) == asyncio.run(runs(chain))

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens = 0

        def on_llm_new_token(self, token, **kwargs) -> None:
            self.tokens += 1

    heard = [Tokens(), Tokens()]
    assert fast.invoke({"topic": "rain"}, {"callbacks": [heard[0]]}) == \
        chain.invoke({"topic": "rain"}, {"callbacks": [heard[1]]})
    assert heard[0].tokens == heard[1].tokens == 0


def test_a_branch_or_map_of_served_calls_streams_plains_chunks_and_events(recording_proxy, runtime):
    """A ``RunnableBranch`` (``create_history_aware_retriever`` is one) or a ``.map()`` whose
    chains call ``ChatOpenAI``: which sub-chain runs, and so how it streams, is known at run
    time only, so a caller that streams gets plain's own stream (the server's chunks, the
    streaming request, every step's events), its requests on the served engine; ``invoke``
    runs the graph."""
    import asyncio

    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableBranch, RunnableLambda
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    llm = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                     max_tokens=6)
    answer = ChatPromptTemplate.from_template("Answer: {q}") | llm | StrOutputParser()
    reply = ChatPromptTemplate.from_template("Reply: {q}") | llm | StrOutputParser()
    branch = RunnableBranch((lambda x: x["t"] == "a", answer), reply)
    x = {"t": "a", "q": QUESTIONS[0]}

    def events(chain, input):
        async def collect():
            return [(e["event"], e["name"], getattr(e["data"].get("chunk"), "content", None),
                     getattr(e["data"].get("chunk"), "response_metadata", None))
                    async for e in chain.astream_events(input, version="v2")]
        return asyncio.run(collect())

    recording_proxy.replay = True  # identical requests get identical replies
    for chain, input in ((branch, x), (RunnableLambda(lambda v: v) | answer.map(), [x])):
        fast = TeolaRunnable(chain, runtime=runtime)
        recording_proxy.take()
        plain_chunks, plain_events = list(chain.stream(input)), events(chain, input)
        sent_plain = recording_proxy.take()
        assert list(fast.stream(input)) == plain_chunks and events(fast, input) == plain_events
        assert bodies(recording_proxy.take()) == bodies(sent_plain)
        assert "on_chat_model_stream" in {e[0] for e in plain_events}
        before = relayed(runtime)
        assert fast.invoke(input) == chain.invoke(input)
        assert relayed(runtime) == before  # invoke: the graph run's own request, not a relayed one
        if chain is branch:  # a stream of the branch streams its model (a .map() streams only events)
            assert [b["stream"] for _, b in sent_plain] == [True, True]


def test_steps_after_the_last_lowered_call_stream_through_their_own_transform(recording_proxy, runtime):
    """A lowered call followed by parsers and generators (partial JSON, a generator of
    words): the stream is plain's chunk for chunk, sync and async, the tail's steps each a
    child run of the chain as in plain (the model's run too, with a ``with_config`` name and
    tags); ``invoke`` still runs the whole chain as one graph, each step's run named and
    tagged as plain's."""
    from langchain_core.output_parsers import JsonOutputParser, StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableGenerator
    from langchain_core.tracers.context import collect_runs
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    json_mode = {"response_format": {"type": "json_object"}}  # valid JSON by construction
    llm = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                     max_tokens=40, seed=0, model_kwargs=json_mode)
    prompt = ChatPromptTemplate.from_template("Write a JSON object with the keys name and city for {who}.")

    def upper_words(chunks):
        pending = ""
        for chunk in chunks:
            pending += chunk
            *words, pending = pending.split(" ")
            yield from (w.upper() for w in words if w)
        if pending:
            yield pending.upper()

    json_chain = prompt | llm | JsonOutputParser()
    named = llm.with_config(run_name="answer", tags=["answer-tag"])  # lowered, its run named as plain's
    words_chain = prompt | named | StrOutputParser() | RunnableGenerator(upper_words)
    question = {"who": "Ada Lovelace"}
    for chain in (json_chain, words_chain):
        fast = TeolaRunnable(chain, runtime=runtime)
        with collect_runs() as plain_runs:
            plain = list(chain.stream(question))
        with collect_runs() as runs:
            got = list(fast.stream(question))
        assert got == plain and len(plain) > 3
        tail_runs = lambda collected: [(r.name, r.tags) for r in collected.traced_runs[0].child_runs  # noqa: E731
                                       if r.name in {"JsonOutputParser", "StrOutputParser", "upper_words"}]
        assert tail_runs(runs) == tail_runs(plain_runs) != []
        model_runs = lambda collected: [(r.name, "answer-tag" in r.tags)  # noqa: E731
                                        for r in collected.traced_runs[0].child_runs if r.run_type == "llm"]
        assert model_runs(runs) == model_runs(plain_runs) == [
            ("answer", True) if chain is words_chain else ("ChatOpenAI", False)]

    async def astream(runnable) -> list:
        return [chunk async for chunk in runnable.astream(question)]

    fast = TeolaRunnable(json_chain, runtime=runtime)
    assert asyncio.run(astream(fast)) == asyncio.run(astream(json_chain))
    with collect_runs() as plain_runs:
        plain = json_chain.invoke(question)
    with collect_runs() as runs:
        assert fast.invoke(question) == plain
    steps = lambda collected: [(r.name, [t for t in r.tags if t.startswith("seq:")])  # noqa: E731
                               for r in sorted(collected.traced_runs[0].child_runs, key=lambda r: r.dotted_order)]
    assert steps(runs) == steps(plain_runs) == [("ChatPromptTemplate", ["seq:step:1"]), ("ChatOpenAI", ["seq:step:2"]),
                                                ("JsonOutputParser", ["seq:step:3"])]
    assert fast._plan(question).trace.opaque == []  # the parser is lowered: invoke is one graph
    assert TeolaRunnable(words_chain, runtime=runtime)._plan(question).trace.opaque[0].component == "upper_words"


# plain's own structured-output stream (langchain-openai's parse events) warns while serialising
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_bound_tools_and_structured_output_are_lowered_and_stream_as_the_model_does(recording_proxy, runtime):
    """``bind_tools`` and ``with_structured_output`` (function calling, and the default
    json_schema response format) as LangChain's docs write them: the call is lowered (its body
    carries the tools / response format, as plain's), the reply's tool calls and the parsed
    objects are plain's, and the model's run reports the same invocation parameters. A named
    ``tool_choice`` and a json_schema response format make the bundled model's output valid
    by construction. Streamed, the chain runs as it is (the model streams tool-call chunks,
    which a graph's token stream cannot reproduce): plain's chunks exactly."""
    from langchain_core.output_parsers.openai_tools import PydanticToolsParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.tracers.context import collect_runs
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    from teola_plugin.langchain import TeolaRunnable

    class Add(BaseModel):
        """Add two integers."""

        a: int
        b: int

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                       max_tokens=40)
    prompt = ChatPromptTemplate.from_messages([("human", "What is {x} plus {y}?")])
    named = {"type": "function", "function": {"name": "Add"}}
    with_tools = prompt | model.bind_tools([Add], tool_choice=named)
    parsed = with_tools | PydanticToolsParser(tools=[Add])
    structured = prompt | model.with_structured_output(Add, method="function_calling")
    question = {"x": 3, "y": 4}

    def calls(message) -> list:
        return [(c["name"], c["args"]) for c in message.tool_calls]

    def llm_params(collected) -> list:
        return [r.extra["invocation_params"] for r in collected.traced_runs[0].child_runs if r.run_type == "llm"]

    fast = TeolaRunnable(with_tools, runtime=runtime)
    assert fast._plan(question).trace.opaque == [] and TeolaRunnable(parsed, runtime=runtime)._plan(
        question).trace.opaque == []
    with collect_runs() as plain_runs:
        plain = with_tools.invoke(question)
    sent_plain = recording_proxy.take()
    with collect_runs() as runs:
        teola = fast.invoke(question)
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain[0][1]["tools"][0]["function"]["name"] == "Add"
    assert calls(teola) == calls(plain) and calls(plain)[0][0] == "Add" and teola.tool_calls[0]["id"]
    assert llm_params(runs) == llm_params(plain_runs) and llm_params(plain_runs)[0]["tools"]
    assert TeolaRunnable(parsed, runtime=runtime).invoke(question) == parsed.invoke(question)
    fast_structured = TeolaRunnable(structured, runtime=runtime)
    assert "ChatOpenAI" not in {n.component for n in fast_structured._plan(question).trace.opaque}
    assert fast_structured.invoke(question) == structured.invoke(question)

    class Person(BaseModel):
        """A person."""

        name: str
        city: str

    # with_structured_output's default method: a json_schema response format, sent through the
    # client's parse (vLLM constrains the reply to the schema)
    described = ChatPromptTemplate.from_messages([("human", "Describe {who} with a name and a city.")]) \
        | model.with_structured_output(Person)
    fast_described = TeolaRunnable(described, runtime=runtime)
    assert fast_described._plan({"who": "x"}).trace.opaque == []  # its refusal check is LangChain's own
    recording_proxy.take()
    plain_person = described.invoke({"who": "Ada Lovelace"})
    sent_plain = recording_proxy.take()
    assert fast_described.invoke({"who": "Ada Lovelace"}) == plain_person and isinstance(plain_person, Person)
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain[0][1]["response_format"]["type"] == \
        "json_schema"
    assert list(fast_described.stream({"who": "Ada Lovelace"})) == list(described.stream({"who": "Ada Lovelace"}))

    async def astream(runnable) -> list:  # the relayed async stream, closed by the SDK's stream helper
        return [chunk async for chunk in runnable.astream({"who": "Ada Lovelace"})]

    assert asyncio.run(astream(fast_described)) == asyncio.run(astream(described))

    def chunks(stream) -> list:  # tool call ids are the server's random ones
        return [(type(c).__name__, c.content, [(t["name"], t["args"], t["index"]) for t in c.tool_call_chunks])
                for c in stream]

    plain_chunks = chunks(with_tools.stream(question))
    assert chunks(fast.stream(question)) == plain_chunks and len(plain_chunks) > 1
    assert list(TeolaRunnable(parsed, runtime=runtime).stream(question)) == list(parsed.stream(question))


def test_completion_models_and_callbacks_see_what_plain_reports(recording_proxy, runtime):
    from langchain_community.llms.vllm import VLLMOpenAI
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
    from langchain_openai import ChatOpenAI, OpenAI

    from teola_plugin.langchain import TeolaRunnable

    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.seen: list[tuple] = []

        def on_chat_model_start(self, serialized, messages, **kwargs):
            self.seen.append(("chat", [(m.type, m.content) for m in messages[0]]))

        def on_llm_start(self, serialized, prompts, **kwargs):
            self.seen.append(("llm", prompts))

        def on_llm_end(self, response, **kwargs):
            generation = response.generations[0][0]
            self.seen.append(("end", generation.text, (response.llm_output or {}).get("token_usage")))

    completion = PromptTemplate.from_template("Q: {question}\nA:")
    models = [VLLMOpenAI(openai_api_base=recording_proxy.base_url, openai_api_key="none", model_name=SERVED_NAME,
                         temperature=0, max_tokens=16),
              OpenAI(base_url=recording_proxy.base_url, api_key="none", model=SERVED_NAME, temperature=0,
                     max_tokens=16)]
    for model in models:
        chain = completion | model.bind(stop=["\n"])
        teola = TeolaRunnable(chain, runtime=runtime)
        assert teola._plan({"question": "x"}).trace.opaque == []
        plain_seen, teola_seen = Recorder(), Recorder()
        question = {"question": QUESTIONS[0]}
        plain = chain.invoke(question, config={"callbacks": [plain_seen]})
        sent_plain = recording_proxy.take()
        assert teola.invoke(question, config={"callbacks": [teola_seen]}) == plain
        assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain[0][0] == "/v1/completions"
        assert teola_seen.seen == plain_seen.seen and plain_seen.seen[-1][2]

    chat = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{question}")]) | ChatOpenAI(
        model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0, max_tokens=16)
    plain_seen, teola_seen = Recorder(), Recorder()
    plain = chat.invoke({"question": QUESTIONS[1]}, config={"callbacks": [plain_seen]})
    teola = TeolaRunnable(chat, runtime=runtime).invoke({"question": QUESTIONS[1]}, config={"callbacks": [teola_seen]})
    assert teola.content == plain.content and teola_seen.seen == plain_seen.seen


@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_lowered_calls_fire_the_llms_own_events(mode, recording_proxy, squad_index, executor):
    """TokenCountingHandler counts what plain counts (the server's usage); the dispatcher
    sees the LLM's start / end events, as LLM.chat / complete fire them — also for a query
    fusion's query generation (its own ``llm.complete``: completion events whatever the
    model, and no predict events; it fired none). Teola's identical
    request gets plain's reply: Teola warms the prompt's prefix first, and a cached prefix can
    decode a different greedy token on the CPU kernels, so a fresh reply's length could differ."""
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.retrievers import QueryFusionRetriever

    class Names(BaseEventHandler):
        names: list = []

        def handle(self, event, **kwargs) -> None:
            if event.class_name().startswith("LLM"):
                self.names.append(event.class_name())

    counter, names, before = TokenCountingHandler(), Names(), Settings.callback_manager
    Settings.callback_manager = CallbackManager([counter])  # as the docs set it up, before the app
    root = get_dispatcher()
    root.add_event_handler(names)
    try:
        llm = openai_like(recording_proxy.base_url, is_chat_model=mode == "chat", context_window=2048)
        engine = squad_index.as_query_engine(llm=llm, similarity_top_k=3, response_mode="tree_summarize")
        fusion = QueryFusionRetriever([squad_index.as_retriever(similarity_top_k=2)], llm=llm, num_queries=3,
                                      similarity_top_k=2, use_async=False)
        recording_proxy.replay = True
        seen = []
        for run in (engine.query, lambda q: executor.query(engine, q), fusion.retrieve,
                    lambda q: executor.retrieve(fusion, q)):
            counter.reset_counts()
            names.names.clear()
            run(QUESTIONS[0])
            seen.append((counter.prompt_llm_token_count, counter.completion_llm_token_count,
                         len(counter.llm_token_counts), sorted(names.names)))
    finally:
        root.event_handlers.remove(names)
        Settings.callback_manager = before
    plain, teola, plain_fusion, teola_fusion = seen
    assert teola == plain and plain[0] > 0 and plain[1] > 0
    kind = "Chat" if mode == "chat" else "Completion"
    assert {f"LLM{kind}StartEvent", f"LLM{kind}EndEvent"} <= set(plain[3])
    assert teola_fusion == plain_fusion and plain_fusion[2] == 1
    assert plain_fusion[3] == ["LLMCompletionEndEvent", "LLMCompletionStartEvent"]


def test_embeddings_teola_computes_fire_the_embedding_models_own_events(recording_proxy, runtime):
    """TokenCountingHandler counts the embedding tokens plain counts, and the dispatcher sees
    plain's EmbeddingStart / End events, for the texts Teola's embedder engine embeds: a
    deferred ingestion's nodes (reported when the next query stores them), the nodes an eager
    executor embeds as they are added, and the query's own string. Both counted nothing."""
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.llama_index import TeolaExecutor

    class Names(BaseEventHandler):
        names: list = []

        def handle(self, event, **kwargs) -> None:
            if event.class_name().startswith("Embedding"):
                self.names.append(event.class_name())

    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:12]]
    counter, names, before = TokenCountingHandler(), Names(), Settings.callback_manager
    Settings.callback_manager = CallbackManager([counter])  # as the docs set it up, before the app
    root = get_dispatcher()
    root.add_event_handler(names)
    recording_proxy.replay = True
    seen = {}
    try:
        llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
        for name, executor in (("plain", None), ("deferred", TeolaExecutor(runtime=runtime)),
                               ("eager", TeolaExecutor(runtime=runtime, defer_ingestion=False))):
            Settings.executor = executor
            counter.reset_counts()
            names.names.clear()
            embed_model = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")
            index = VectorStoreIndex.from_documents(docs, embed_model=embed_model)
            built = (counter.total_embedding_token_count, len(counter.embedding_token_counts))
            engine = index.as_query_engine(llm=llm, similarity_top_k=2)
            answer = engine.query(QUESTIONS[0])
            queried = (counter.total_embedding_token_count, len(counter.embedding_token_counts))
            asked = str(asyncio.run(engine.aquery(QUESTIONS[1])))  # the async path: its query string
            seen[name] = (built, queried, counter.total_embedding_token_count, len(counter.embedding_token_counts),
                          sorted(names.names), str(answer), asked)
    finally:
        root.event_handlers.remove(names)
        Settings.callback_manager = before
        Settings.executor = None
    plain = seen["plain"]
    # 12 nodes in two calls of embed_batch_size 10, then each query's string in one
    assert plain[1][0] > 0 and plain[1][1] == 13 and plain[2] > plain[1][0] and plain[3] == 14
    assert plain[4] == ["EmbeddingEndEvent"] * 4 + ["EmbeddingStartEvent"] * 4
    assert seen["eager"] == plain
    assert seen["deferred"][1:] == plain[1:] and seen["deferred"][0] == (0, 0)  # the nodes are stored later


@pytest.mark.parametrize("index_type", ["SummaryIndex", "SimpleKeywordTableIndex"])
def test_model_free_index_retrievers_are_lowered(index_type, recording_proxy, executor):
    """A summary index's retriever (every node) and a simple keyword table's (regex keywords
    looked up in its table) read their own index without a model: CPU steps, not opaque."""
    import llama_index.core

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
    index = getattr(llama_index.core, index_type).from_documents(
        [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:3]],
        **({"llm": llm} if "Keyword" in index_type else {}))  # it would resolve Settings.llm
    engine = index.as_query_engine(llm=llm)
    assert executor.traced(engine).opaque == []
    question = QUESTIONS[0]
    plain = engine.query(question)
    sent_plain = recording_proxy.take()
    teola = executor.query(engine, question)
    assert str(teola) == str(plain) and [n.node.node_id for n in teola.source_nodes] == [
        n.node.node_id for n in plain.source_nodes] and plain.source_nodes
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and sent_plain


def test_a_lowered_calls_start_reports_plains_messages_and_metadata(recording_proxy, runtime):
    """``on_chat_model_start`` hears the model's own input messages (a history's ids and
    metadata kept, as LangGraph state and chat histories carry them), not messages rebuilt
    from the request body, and the run's metadata holds the model's LangSmith params
    (``ls_integration`` included), as plain's invoke reports them."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    class Heard(BaseCallbackHandler):
        def __init__(self) -> None:
            self.starts: list = []

        def on_chat_model_start(self, serialized, messages, *, metadata=None, invocation_params=None,
                                **kwargs) -> None:
            self.starts.append((messages, {k: v for k, v in (metadata or {}).items() if k.startswith("ls_")},
                                invocation_params, kwargs.get("options")))

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", max_tokens=8,
                       temperature=0)
    history = [HumanMessage("Name a colour.", id="m1"),
               AIMessage("Blue.", id="m2", response_metadata={"model_name": SERVED_NAME},
                         usage_metadata={"input_tokens": 5, "output_tokens": 2, "total_tokens": 7})]
    templated = ChatPromptTemplate.from_messages([("system", "Answer briefly."), MessagesPlaceholder("history"),
                                                 ("human", "{q}")]) | model | StrOutputParser()
    direct = model | StrOutputParser()  # the model's input is the caller's message list itself
    recording_proxy.replay = True
    for chain, given in ((templated, {"history": history, "q": "And another?"}),
                         (direct, [*history, HumanMessage("And another?", id="m3")])):
        teola = TeolaRunnable(chain, runtime=runtime)
        assert teola._plan(given).trace.opaque == []
        heard = []
        for run in (chain.invoke, teola.invoke):
            handler = Heard()
            run(given, config={"callbacks": [handler]})
            heard.append(handler.starts)
        assert heard[1] == heard[0] and len(heard[0]) == 1, heard
        (messages,), ls, _, _ = heard[0][0]
        assert [m.id for m in messages if m.id] == ["m1", "m2"] + (["m3"] if chain is direct else [])
        assert ls["ls_integration"] == "langchain_chat_model" and ls["ls_model_name"] == SERVED_NAME

    # model.with_config(callbacks=[handler]): the handler hears the lowered call as plain's
    bound_handler = Heard()
    bound = ChatPromptTemplate.from_messages([("human", "{q}")]) | model.with_config(callbacks=[bound_handler]) \
        | StrOutputParser()
    teola = TeolaRunnable(bound, runtime=runtime)
    assert teola._plan({"q": "Name a fruit."}).trace.opaque == []
    heard, answers = [], []
    for run in (bound.invoke, teola.invoke):
        bound_handler.starts.clear()
        answers.append(run({"q": "Name a fruit."}))
        heard.append(list(bound_handler.starts))
    assert heard[1] == heard[0] and len(heard[0]) == 1 and answers[1] == answers[0]


def test_partial_variables_render_as_plain(recording_proxy, runtime):
    """``prompt.partial(...)`` as LangChain's docs use it: a caller's value for a partial
    variable wins (``partial(chat_history=[])`` then a history per call), and a function
    partial is called once per call, its one value in the request, the prompt's run and the
    model's reported input."""
    from langchain_core.messages import HumanMessage
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.tracers.context import collect_runs
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaRunnable

    calls = []

    def today() -> str:
        calls.append(1)
        return f"day {len(calls)}"

    model = ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", max_tokens=6,
                       temperature=0)
    prompt = ChatPromptTemplate.from_messages([("system", "Today is {date}. Speak {lang}."),
                                               MessagesPlaceholder("history"), ("human", "{q}")])
    chain = prompt.partial(date=today, lang="French", history=[]) | model | StrOutputParser()
    given = {"q": "Hello", "lang": "German", "history": [HumanMessage("I am Carl.")]}
    recording_proxy.replay = True
    seen = []
    for run in (chain, TeolaRunnable(chain, runtime=runtime)):
        calls.clear()
        recording_proxy.take()
        with collect_runs() as runs:
            answer = run.invoke(given)
        (body,) = [b for _, b in recording_proxy.take()]
        children = {r.name: r for r in runs.traced_runs[0].child_runs}
        seen.append((answer, len(calls), body["messages"],
                     children["ChatPromptTemplate"].outputs["output"].to_messages(),
                     children["ChatOpenAI"].inputs))
    assert seen[1] == seen[0] and seen[0][1] == 1
    assert seen[0][2][0]["content"] == "Today is day 1. Speak German." and seen[0][2][1]["content"] == "I am Carl."
    assert TeolaRunnable(chain, runtime=runtime)._plan(given).trace.opaque == []


def test_a_streamed_llama_index_call_ends_with_plains_last_chunk_for_token_counters(recording_proxy, squad_index,
                                                                                       executor):
    """LlamaIndex's token-counting docs with a streaming query engine: the call's end event
    carries the last streamed chunk as ``raw``, as plain's, so ``TokenCountingHandler`` counts
    what plain counts (it failed with a ValueError on a tuple of every chunk)."""
    from llama_index.core import Settings
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    class LLMEventNames(BaseEventHandler):  # LLM.stream's events: no predict end; the end's last delta
        seen: list = []

        @classmethod
        def class_name(cls) -> str:
            return "LLMEventNames"

        def handle(self, event, **kwargs) -> None:
            name = type(event).__name__
            if name.startswith("LLM") and "InProgress" not in name:
                self.seen.append((name, getattr(getattr(event, "response", None), "delta", None)))

    counter = TokenCountingHandler(tokenizer=lambda s: s.split())
    names = LLMEventNames(seen=[])
    before = Settings.callback_manager
    Settings.callback_manager = CallbackManager([counter])  # as the docs set it: the engine's parts take it
    get_dispatcher().add_event_handler(names)
    try:
        llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
        engine = squad_index.as_query_engine(llm=llm, similarity_top_k=2, streaming=True)
        recording_proxy.replay = True
        counted = []
        for run in (engine.query, lambda q: executor.query(engine, q)):
            counter.reset_counts()
            names.seen.clear()
            tokens = list(run(QUESTIONS[1]).response_gen)
            counted.append((tokens, counter.prompt_llm_token_count, counter.completion_llm_token_count,
                            len(counter.llm_token_counts), list(names.seen)))
    finally:
        Settings.callback_manager = before
        get_dispatcher().event_handlers.remove(names)
    assert counted[1] == counted[0] and counted[0][2] > 0 and counted[0][3] == 1, counted
    assert [n for n, _ in counted[0][4]] == ["LLMPredictStartEvent", "LLMChatStartEvent", "LLMChatEndEvent"]


def test_a_streamed_llama_index_call_sends_the_stream_options_of_its_llm(recording_proxy, squad_index, executor):
    """``OpenAILike(additional_kwargs={"stream_options": {"include_usage": True}})``: its own
    streaming calls send them (its non-streaming ones leave them out), and so does Teola; the
    usage chunk then streams as plain's last, empty token."""
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048,
                      additional_kwargs={"stream_options": {"include_usage": True}})
    engine = squad_index.as_query_engine(llm=llm, similarity_top_k=2, streaming=True)
    recording_proxy.replay = True
    plain_tokens = list(engine.query(QUESTIONS[1]).response_gen)
    sent_plain = recording_proxy.take()
    tokens = list(executor.query(engine, QUESTIONS[1]).response_gen)
    assert bodies(recording_proxy.take()) == bodies(sent_plain)
    assert sent_plain[-1][1]["stream_options"] == {"include_usage": True} and tokens == plain_tokens


class SpanTree:
    """Every span (name, its parent's name, dropped?) and event (type, its span's name) that
    LlamaIndex's dispatchers report, in order."""

    def __enter__(self):
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

        tree = self
        self.spans, self.events, self.names = [], [], {}

        class Spans(BaseSpanHandler):
            def new_span(self, id_, bound_args, instance=None, parent_span_id=None, tags=None, **kwargs):
                tree.names[id_] = id_.rsplit("-", 5)[0]
                tree.spans.append(("open", tree.names[id_], tree.names.get(parent_span_id)))

            def prepare_to_exit_span(self, id_, bound_args, instance=None, result=None, **kwargs):
                tree.spans.append(("exit", tree.names.get(id_)))

            def prepare_to_drop_span(self, id_, bound_args, instance=None, err=None, **kwargs):
                tree.spans.append(("drop", tree.names.get(id_)))

        class Events(BaseEventHandler):
            def handle(self, event, **kwargs) -> None:
                record = (event.class_name(), tree.names.get(event.span_id))
                if "InProgress" in record[0]:  # a streamed chunk's: its delta and the text so far
                    response = event.response
                    record += (response.delta, getattr(response, "text", None) or response.message.content)
                elif record[0] == "ExceptionEvent":  # what failed: its type
                    record += (type(event.exception).__name__,)
                tree.events.append(record)

        self.handlers = Spans(), Events()
        root = get_dispatcher()
        root.add_span_handler(self.handlers[0])
        root.add_event_handler(self.handlers[1])
        return self

    def __exit__(self, *exc):
        root = get_dispatcher()
        root.span_handlers.remove(self.handlers[0])
        root.event_handlers.remove(self.handlers[1])

    def take(self) -> tuple[list, list]:
        # Teola packs a synthesizer's text while planning its calls: the splitter's spans open
        # in ``synthesize`` there, in ``get_response`` in plain (docs/integrations.md)
        spans = [s for s in self.spans if not (s[1] or "").startswith("TokenTextSplitter")]
        taken = spans, list(self.events)
        self.spans.clear(), self.events.clear()
        return taken


@pytest.mark.parametrize("mode", ["compact", "refine", "tree_summarize", "compact_accumulate"])
def test_a_lowered_query_reports_plains_spans_and_events(mode, recording_proxy, squad_index, executor):
    """Span handlers (Phoenix, Langfuse) and event handlers see a lowered query as plain's: the
    same spans with the same parents (the engine's ``_query``, the retriever's ``retrieve`` /
    ``_retrieve``, the query embedding, ``synthesize``, ``get_response``, the refine program,
    ``predict``, the model's two ``chat`` spans), each event in the span plain fires it in, and
    the callback manager's RETRIEVE / SYNTHESIZE events; sync and async; an LLM call that
    fails drops the spans it was in, as plain's does."""
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler

    from llama_index.core import get_response_synthesizer
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import VectorIndexRetriever

    debug = LlamaDebugHandler(print_trace_on_end=False)
    callbacks = CallbackManager([debug])
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, callback_manager=callbacks)
    retriever = VectorIndexRetriever(squad_index, similarity_top_k=3, callback_manager=callbacks)
    synthesizer = get_response_synthesizer(llm=llm, response_mode=mode, callback_manager=callbacks)
    engine = RetrieverQueryEngine(retriever, synthesizer, callback_manager=callbacks)
    plain_gets_teolas_replies(recording_proxy)

    def callback_events() -> list[str]:
        events = [e.event_type.value for e in debug.get_events()]
        debug.flush_event_logs()
        return events

    seen = {}
    with SpanTree() as tree:
        for name, run in (("teola", lambda q: executor.query(engine, q)), ("plain", engine.query),
                          ("teola async", lambda q: asyncio.run(executor.aquery(engine, q))),
                          ("plain async", lambda q: asyncio.run(engine.aquery(q)))):
            callback_events()
            answer = str(run(QUESTIONS[0]))
            seen[name] = (answer, *tree.take(), callback_events())
    for kind in ("", " async"):
        plain, teola = seen["plain" + kind], seen["teola" + kind]
        assert teola[0] == plain[0] and plain[0]
        if mode in ("tree_summarize", "compact_accumulate"):  # calls that run at once: in any order
            assert sorted(teola[1]) == sorted(plain[1]) and sorted(teola[2]) == sorted(plain[2])
        else:
            assert teola[1] == plain[1] and teola[2] == plain[2]
        assert sorted(teola[3]) == sorted(plain[3])
    opened = {s[1:] for s in seen["plain"][1] if s[0] == "open"}
    assert {("VectorIndexRetriever._retrieve", "VectorIndexRetriever.retrieve"),
            ("OpenAILike.predict", {"tree_summarize": "TreeSummarize.get_response",
                                    "compact_accumulate": "CompactAndAccumulate.get_response"}.get(
                                        mode, "DefaultRefineProgram.__call__")),
            ("OpenAILike.chat", "OpenAILike.chat")} <= opened
    if mode.startswith("compact"):  # its own get_response around its parent class's
        own = f"{type(synthesizer).__name__}.get_response"
        assert (own, own) in opened
    assert {"query", "retrieve", "synthesize", "llm"} <= set(seen["plain"][3])

    # a call the server rejects (more new tokens than its context holds): plain's spans are dropped
    llm.max_tokens = 4096
    dropped = {}
    with SpanTree() as tree:
        for name, run in (("plain", engine.query), ("teola", lambda q: executor.query(engine, q))):
            with pytest.raises(openai.BadRequestError):
                run(QUESTIONS[1])
            dropped[name] = sorted(s[1] for s in tree.take()[0] if s[0] == "drop")
    assert dropped["teola"] == dropped["plain"]
    assert {"OpenAILike.chat", "OpenAILike.predict", "RetrieverQueryEngine._query"} <= set(dropped["plain"])


def test_nested_engines_and_streamed_answers_report_plains_spans_and_events(recording_proxy, squad_index, executor):
    """The query engine a HyDE ``TransformQueryEngine`` runs reports its own ``query`` span,
    ``QueryStart`` / ``End`` and ``QUERY`` callback event, as plain's ``engine.query`` does;
    a streaming query reports its retrieval and its ``synthesize`` span and events (which end
    when the response is returned, before its tokens are read); a ``CitationQueryEngine`` its
    own ``RETRIEVE``; a chat engine's answer its LLM call's spans, all as plain's."""
    from llama_index.core import get_response_synthesizer
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
    from llama_index.core.chat_engine import ContextChatEngine
    from llama_index.core.indices.query.query_transform import HyDEQueryTransform
    from llama_index.core.query_engine import CitationQueryEngine, RetrieverQueryEngine, TransformQueryEngine
    from llama_index.core.retrievers import VectorIndexRetriever

    debug = LlamaDebugHandler(print_trace_on_end=False)
    callbacks = CallbackManager([debug])
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, callback_manager=callbacks)

    def engine(streaming: bool = False) -> RetrieverQueryEngine:
        retriever = VectorIndexRetriever(squad_index, similarity_top_k=2, callback_manager=callbacks)
        synth = get_response_synthesizer(llm=llm, streaming=streaming, callback_manager=callbacks)
        return RetrieverQueryEngine(retriever, synth, callback_manager=callbacks)

    hyde = TransformQueryEngine(engine(), HyDEQueryTransform(llm=llm), callback_manager=callbacks)
    streaming = engine(streaming=True)
    citation = CitationQueryEngine(VectorIndexRetriever(squad_index, similarity_top_k=2, callback_manager=callbacks),
                                   llm=llm, callback_manager=callbacks)
    chat = ContextChatEngine.from_defaults(
        VectorIndexRetriever(squad_index, similarity_top_k=2, callback_manager=callbacks), llm=llm)

    def chatted(target, question):  # the chat engine's own code under the executor, its calls on Teola
        Settings.executor = executor
        try:
            return target.chat(question)
        finally:
            Settings.executor = None

    plain_gets_teolas_replies(recording_proxy)
    seen = {}
    with SpanTree() as tree:
        for kind, target, run in (("hyde", hyde, executor.query), ("stream", streaming, executor.query),
                                  ("citation", citation, executor.query), ("chat", chat, chatted)):
            for name, call in (("teola", run), ("plain", lambda t, q: t.chat(q) if kind == "chat" else t.query(q))):
                if kind == "chat":
                    chat.reset()
                    tree.take()
                debug.flush_event_logs()
                response = call(target, QUESTIONS[0])
                text = "".join(response.response_gen) if kind == "stream" else str(response)
                spans, events = tree.take()
                seen[f"{name} {kind}"] = (text, sorted(spans), sorted(events),
                                          sorted(e.event_type.value for e in debug.get_events()))
    for kind in ("hyde", "stream", "citation", "chat"):
        plain, teola = seen["plain " + kind], seen["teola " + kind]
        assert teola == plain and plain[0]
    assert ("open", "RetrieverQueryEngine.query", "TransformQueryEngine._query") in seen["plain hyde"][1]
    assert ("QueryStartEvent", "RetrieverQueryEngine.query") in seen["plain hyde"][2]
    assert ("SynthesizeEndEvent", "CompactAndRefine.synthesize") in seen["plain stream"][2]
    streamed = [e for e in seen["plain stream"][2] if e[0] == "LLMChatInProgressEvent"]
    assert len(streamed) > 3 and len({e[1] for e in streamed}) == 1 and streamed[0][1]  # one per chunk, in its span
    assert max((e[3] for e in streamed), key=len) == seen["plain stream"][0]  # the text so far, at the end: the answer
    assert ("LLMChatStartEvent", "OpenAILike.chat") in seen["plain chat"][2]
    for kind in ("hyde", "stream", "citation"):
        assert {"query", "retrieve", "synthesize", "llm"} <= set(seen["plain " + kind][3])
    assert seen["plain citation"][3].count("retrieve") == 4  # its own RETRIEVE around the retriever's


def test_fusion_retrievals_and_llm_rerank_calls_report_plains_events_and_spans(recording_proxy, squad_index,
                                                                                executor):
    """Each generated query a ``QueryFusionRetriever`` retrieves reports its retriever's
    ``retrieve`` / ``_retrieve`` spans, ``RetrievalStart`` / ``End`` events and ``RETRIEVE``
    callback event (LlamaDebugHandler counts one per query and retriever, as plain), with its
    query's embedding inside (one batched embedding on the engine, each query's reported in
    its retrieval; under ``use_async`` as the awaited ``aretrieve`` / ``aget_query_embedding``,
    the question's too); each ``LLMRerank`` batch call its ``predict`` and the model's
    ``chat`` spans. Spans are compared by (name, parent's name), events by name and span."""
    from collections import Counter

    from llama_index.core import get_response_synthesizer
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
    from llama_index.core.postprocessor import LLMRerank
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import QueryFusionRetriever, VectorIndexRetriever

    debug = LlamaDebugHandler(print_trace_on_end=False)
    callbacks = CallbackManager([debug])
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=24,
                      callback_manager=callbacks)
    fusions = {use_async: QueryFusionRetriever(
        [VectorIndexRetriever(squad_index, similarity_top_k=2, callback_manager=callbacks)], llm=llm, num_queries=3,
        use_async=use_async, callback_manager=callbacks) for use_async in (False, True)}
    reranked = RetrieverQueryEngine(
        VectorIndexRetriever(squad_index, similarity_top_k=4, callback_manager=callbacks),
        get_response_synthesizer(llm=llm, callback_manager=callbacks),
        node_postprocessors=[LLMRerank(llm=llm, top_n=2, choice_batch_size=2)], callback_manager=callbacks)
    plain_gets_teolas_replies(recording_proxy)
    seen = {}
    with SpanTree() as tree:
        for kind, plain_call, teola_call in (
                *((f"fusion{'_async' * a}", lambda f=f: f.retrieve(QUESTIONS[0]),
                   lambda f=f: executor.retrieve(f, QUESTIONS[0])) for a, f in fusions.items()),
                ("rerank", lambda: reranked.query(QUESTIONS[0]), lambda: executor.query(reranked, QUESTIONS[0]))):
            for name, call in (("teola", teola_call), ("plain", plain_call)):
                debug.flush_event_logs()
                tree.take()
                result = call()
                spans, events = tree.take()
                seen[f"{name} {kind}"] = (
                    str(result) if kind == "rerank" else [n.node.node_id for n in result],
                    Counter(s[1:] for s in spans if s[0] == "open"), Counter(e[:2] for e in events),
                    Counter(e.event_type.value for e in debug.get_events()))
    for kind in ("fusion", "fusion_async", "rerank"):
        assert seen["teola " + kind] == seen["plain " + kind], kind
    assert seen["plain fusion"][3]["retrieve"] == 2 * 4  # start and end: the fusion's, the question's, 2 generated
    assert seen["plain fusion"][1][("VectorIndexRetriever.retrieve", "QueryFusionRetriever._retrieve")] == 3
    assert seen["plain fusion"][1][("HuggingFaceEmbedding.get_query_embedding", "VectorIndexRetriever._retrieve")] == 3
    assert seen["plain fusion_async"][1][("VectorIndexRetriever.aretrieve", "QueryFusionRetriever._retrieve")] == 3
    assert seen["plain rerank"][1][("OpenAILike.predict", "LLMRerank._postprocess_nodes")] == 2  # its 2 batches


def test_a_streamed_answers_llm_events_keep_the_readers_pace_as_plain(recording_proxy, squad_index, executor):
    """Plain's streamed LLM call fires its events from the generator its reader pulls: a
    chunk's ``LLMChatInProgressEvent`` just before the token is handed on, so a chat engine's
    ``StreamChatDeltaReceivedEvent`` for it comes next, the end once the reader is past the
    last token, and ``GeneratorExit`` (no end, no event of an unread chunk) when the reader
    closes the stream early. Teola's, whose chunks arrive from the engine ahead of the
    reader, keep the reader's pace too (they once came as they arrived, interleaving at random)."""
    import time as _time

    from llama_index.core import get_response_synthesizer
    from llama_index.core.chat_engine import CondensePlusContextChatEngine
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import VectorIndexRetriever

    codes = {"LLMChatInProgressEvent": "P", "StreamChatDeltaReceivedEvent": "D", "LLMChatEndEvent": "E",
             "StreamChatEndEvent": "S", "ExceptionEvent": "X"}
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    plain_gets_teolas_replies(recording_proxy)
    seen = {}
    with SpanTree() as tree:
        for name in ("teola", "plain"):
            Settings.executor = executor if name == "teola" else None
            try:
                chat = CondensePlusContextChatEngine.from_defaults(
                    VectorIndexRetriever(squad_index, similarity_top_k=2), llm=llm)
                tree.take()
                text = "".join(chat.stream_chat(QUESTIONS[0]).response_gen)
                _time.sleep(0.5)  # anything still to come
                read = "".join(codes.get(e[0], "") for e in tree.take()[1])
                engine = RetrieverQueryEngine(VectorIndexRetriever(squad_index, similarity_top_k=2),
                                              get_response_synthesizer(llm=llm, streaming=True))
                tokens = engine.query(QUESTIONS[1]).response_gen
                first = [next(tokens), next(tokens)]
                tokens.close()
                _time.sleep(1.0)  # the run Teola cancels reports nothing more of the call
                left = ["".join((codes[e[0]], *e[2:])) if e[0] == "ExceptionEvent" else codes[e[0]]
                        for e in tree.take()[1] if e[0] in codes]
            finally:
                Settings.executor = None
            seen[name] = (text, read, first, left)
    assert seen["teola"] == seen["plain"]
    text, read, first, left = seen["plain"]
    assert text and read.startswith("PP") and read.endswith("PES") and "PDPD" in read  # the model's role chunk first
    assert left[-1] == "XGeneratorExit" and left[:-1] == ["P"] * len(left[:-1]) and len(left) >= 3


def test_a_streaming_summarizer_streams_and_reports_as_plain_while_someone_listens(recording_proxy, squad_index,
                                                                                     executor):
    """A streaming ``tree_summarize`` / ``simple_summarize`` / ``generation`` synthesizer, used
    directly under ``Settings.executor`` (``get_response``, ``synthesize``) and in a query engine,
    while a span / event handler listens: the same tokens and streaming requests, and the same
    spans and events, ``llm.stream``'s nested in ``get_response`` where plain calls it. (With a
    listener, these once sent unstreamed requests and streamed no token.)"""
    from llama_index.core import get_response_synthesizer
    from llama_index.core.schema import NodeWithScore, TextNode

    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=12)
    texts = [p.text[:300] for p in datasets.load_corpus("squad-xquad-en")[:3]]
    nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=1.0) for i, t in enumerate(texts)]
    plain_gets_teolas_replies(recording_proxy)
    seen = {}
    with SpanTree() as tree:
        for mode in ("tree_summarize", "simple_summarize", "generation"):
            synth = get_response_synthesizer(llm=llm, response_mode=mode, streaming=True)
            engine = squad_index.as_query_engine(llm=llm, similarity_top_k=2, response_mode=mode, streaming=True)
            for side in ("teola", "plain"):
                Settings.executor = executor if side == "teola" else None
                recording_proxy.requests.clear()
                try:
                    tokens = (list(synth.get_response(QUESTIONS[0], texts)),
                              list(synth.synthesize(QUESTIONS[0], nodes).response_gen),
                              list(engine.query(QUESTIONS[0]).response_gen))
                finally:
                    Settings.executor = None
                spans, events = tree.take()
                seen[side, mode] = (tokens, bodies(recording_proxy.requests), sorted(map(str, spans)),
                                    sorted(map(str, events)))
    for mode, owner in (("tree_summarize", "TreeSummarize"), ("simple_summarize", "SimpleSummarize"),
                        ("generation", "Generation")):
        plain = seen["plain", mode]
        assert seen["teola", mode] == plain
        assert all(len(t) > 3 for t in plain[0]) and all('"stream": true' in b for b in plain[1])
        assert str(("open", "OpenAILike.stream", f"{owner}.get_response")) in plain[2]
        assert any("LLMChatInProgressEvent" in e for e in plain[3])
