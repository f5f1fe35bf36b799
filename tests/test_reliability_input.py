"""Bad input through the public API (hypothesis, derandomized): each call either works or
raises a clear, documented error (docs/reliability.md lists them), and the executor /
runnable / engines stay usable afterwards. Real engines for queries and documents; the
configuration checks need none."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from teola_plugin.errors import ConfigError, EngineInputError, TeolaError
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaRunnable
from teola_plugin.llama_index import TeolaExecutor
from teola_plugin.runtime.runtime import Runtime
from tests.reliability import wait_idle

FEW = settings(max_examples=12, derandomize=True, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MANY = settings(max_examples=150, derandomize=True, deadline=None)

control = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=30)
queries = st.one_of(st.just(""), st.text(max_size=120), control,
                    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), max_size=40),
                    # short, or over the 4,096-token context (rejected before any prefill): a
                    # prompt of thousands of tokens that fits costs a minute of CPU prefill
                    st.one_of(st.integers(1, 40), st.integers(2_100, 40_000)).map(lambda n: "lorem ipsum " * n))
anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True),
                     st.text(max_size=20), st.binary(max_size=5), st.lists(st.text(max_size=10), max_size=3),
                     st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def clear(exc: BaseException, *names: str) -> bool:
    """One of the documented types, with a message (naming the parameter when given)."""
    msg = str(exc)
    return isinstance(exc, (TeolaError, TypeError, ValueError)) and bool(msg) and (
        not names or any(n in msg for n in names))


# -- queries (real engines) -------------------------------------------------------------------
@pytest.mark.slow
def test_any_query_text_answers_or_fails_clearly_and_the_chain_stays_usable(runtime, call):
    chain = ChatPromptTemplate.from_template("Answer in a word: {question}") | TeolaChatModel(
        runtime=runtime, max_tokens=3) | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime, timeout_s=300)
    outcomes = []

    @FEW
    @given(q=queries)
    @example(q="lorem ipsum " * 3000)  # longer than the model's 4,096-token context
    @example(q="\x00\x07\x1b[31m\r\n")
    def one(q):
        try:
            out = fast.invoke({"question": q})
        except EngineInputError as exc:  # the only expected failure: a prompt over the context
            assert "context length" in str(exc), exc
            outcomes.append("too long")
        else:
            assert isinstance(out, str)
            outcomes.append("ok")

    one()
    assert "too long" in outcomes and "ok" in outcomes
    assert isinstance(fast.invoke({"question": "What is the Rhine?"}), str)  # still usable
    assert call(wait_idle(runtime, 30)) == {}


@pytest.mark.slow
def test_documents_of_any_type_embed_or_fail_naming_the_bad_one(runtime, call):
    emb = TeolaEmbeddings(runtime=runtime)

    @FEW
    @given(docs=st.lists(st.one_of(st.text(max_size=60), control, st.none(), st.integers(), st.binary(max_size=4)),
                         max_size=5))
    @example(docs=["", " ", "\x00"])
    def one(docs):
        if all(isinstance(d, str) for d in docs):
            vectors = emb.embed_documents(docs)
            assert len(vectors) == len(docs) and all(len(v) == 384 and all(map(math.isfinite, v)) for v in vectors)
        else:
            with pytest.raises(EngineInputError, match=r"texts\[\d+\] must be str"):
                emb.embed_documents(docs)

    one()
    assert len(emb.embed_query("still usable")) == 384


@pytest.mark.slow
def test_graph_documents_of_unsupported_types_fail_before_any_write(runtime, call):
    g = PGraph("chunk_only")
    docs = g.input("docs", T.DOCS)
    g.output("texts", g.add("chunk", inputs={"docs": docs}, attrs={"chunk_size": 50}).out("texts"))
    for bad in ([object()], [3], [b"bytes"], [{"no_text": 1}]):
        with pytest.raises(EngineInputError, match="unsupported type"):
            call(runtime.execute(g, {"docs": bad}, timeout_s=60))
    out = call(runtime.execute(g, {"docs": ["", "a short text", {"text": "x" * 120, "id": "d"}]}, timeout_s=60))
    assert out["texts"][0] == "" and "".join(out["texts"][2:]).replace(" ", "").startswith("x" * 50)


@pytest.mark.slow
def test_wrong_types_at_the_runtime_and_engines_fail_clearly(runtime, call):
    g = PGraph("echo")
    q = g.input("question", T.TEXT)
    g.output("out", g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"}).out())
    for graph, inputs, timeout, name in [("not a graph", {}, None, "PGraph"), (g, ["question"], None, "dict"),
                                         (g, {}, None, "question"), (g, {"question": "a"}, 0, "timeout_s"),
                                         (g, {"question": "a"}, -1.0, "timeout_s"),
                                         (g, {"question": "a"}, float("nan"), "timeout_s"),
                                         (g, {"question": "a"}, "10", "timeout_s")]:
        with pytest.raises(Exception) as exc:
            call(runtime.execute(graph, inputs, timeout_s=timeout))
        assert clear(exc.value, name), exc.value
    embedder = runtime.engines("embedder")
    for method, args in [("no_such_method", ()), ("_load", ()), ("embed", ("a bare string",)), ("embed", ([1, 2],))]:
        with pytest.raises(EngineInputError):
            call(embedder.call(method, *args))
    with pytest.raises(EngineInputError, match="has no operation"):
        call(embedder.submit("generate", {"prompt": "x"}, __import__("teola_plugin.runtime.policies",
                                                                     fromlist=["Priority"]).Priority()))
    assert call(runtime.execute(g, {"question": "fine"}, timeout_s=30)) == {"out": ["fine"]}


# -- the LlamaIndex executor: bad queries, bad targets, then a good call -------------------------------
def outcome(fn):
    """The exception ``fn()`` raises (a stream is read to its end), or None."""
    try:
        out = fn()
        if getattr(out, "response_gen", None) is not None:
            "".join(out.response_gen)
    except Exception as exc:  # noqa: BLE001 — compared below
        return exc
    return None


@pytest.mark.slow
def test_executor_raises_plain_llama_index_exception_types_for_bad_queries_and_stays_usable(runtime):
    import asyncio

    from llama_index.core import Document, Settings, VectorStoreIndex

    from teola_plugin import datasets
    from teola_plugin.llama_index import TeolaEmbedding, TeolaLLM

    passages = datasets.load_corpus("squad-xquad-en")[:8]
    index = VectorStoreIndex.from_documents([Document(text=p.text) for p in passages],
                                            embed_model=TeolaEmbedding(runtime=runtime))
    retriever = index.as_retriever(similarity_top_k=2)
    llm = TeolaLLM(runtime=runtime, max_tokens=4)
    engine, streaming = (index.as_query_engine(llm=llm, similarity_top_k=2, streaming=s) for s in (False, True))
    executor = TeolaExecutor(runtime, timeout_s=120)
    calls = {"query": engine.query, "stream": streaming.query, "retrieve": retriever.retrieve,
             "aquery": lambda q: asyncio.run(engine.aquery(q)),
             "aretrieve": lambda q: asyncio.run(retriever.aretrieve(q))}

    def both(name, query):
        Settings.executor = None
        plain = outcome(lambda: calls[name](query))
        Settings.executor = executor
        try:
            return plain, outcome(lambda: calls[name](query))
        finally:
            Settings.executor = None

    for bad in (None, 3, b"bytes", ["a list"], {"q": 1}):  # pydantic ValidationError, AttributeError
        for name in calls:
            plain, teola = both(name, bad)
            assert plain is not None and type(teola) is type(plain), (name, bad, plain, teola)
            assert any("not a str or QueryBundle" in note for note in teola.__notes__)
    for name in ("retrieve", "aquery"):  # the tokenizer's TypeError, saying now what is wrong
        plain, teola = both(name, "a lone \ud800 surrogate")
        assert type(teola) is type(plain) is TypeError
        assert any("lone surrogate U+D800 at character 7" in note for note in teola.__notes__)
    for name in ("query", "stream", "aquery"):  # longer than the model's context
        plain, teola = both(name, "lorem ipsum " * 20_000)
        assert type(teola) is type(plain) is ValueError
        assert any("240,000 characters" in note and "context window" in note for note in teola.__notes__)
    for target in (None, "a string", retriever.retrieve, index):
        with pytest.raises(TypeError, match="takes a"):
            executor.query(target, "q")
        with pytest.raises(TypeError, match="takes a"):
            executor.retrieve(target, "q")
    for q in ("\x00\x1b", "é" * 3000, " "):  # odd but valid text: answered
        assert len(executor.retrieve(retriever, q)) == 2
    # An empty query has nothing to embed: plain LlamaIndex searches its store without a
    # vector and the store raises (TypeError on None); through Teola, the same search, the
    # same error, naming the step it came from.
    for name in calls:
        plain, teola = both(name, "")
        assert type(teola) is type(plain) is TypeError and str(teola) == str(plain), (name, plain, teola)
        assert any("retrieved_nodes" in note for note in teola.__notes__)
    nodes = executor.retrieve(retriever, "Which NFL team represented the AFC at Super Bowl 50?")
    assert len(nodes) == 2 and all(n.node.get_content() for n in nodes)


@pytest.mark.slow
def test_teola_runnable_raises_the_plain_chains_exception_types_with_a_clear_message(runtime):
    import asyncio

    chain = ChatPromptTemplate.from_template("Answer in a word: {question}") | TeolaChatModel(
        runtime=runtime, max_tokens=3) | StrOutputParser()
    wrapped = TeolaRunnable(chain, runtime=runtime, timeout_s=300)

    async def collect(stream):
        return [chunk async for chunk in stream]

    entry_points = {"invoke": lambda c, x: c.invoke(x), "ainvoke": lambda c, x: asyncio.run(c.ainvoke(x)),
                    "stream": lambda c, x: list(c.stream(x)), "astream": lambda c, x: asyncio.run(collect(c.astream(x)))}
    cases = {"missing variable": ({}, KeyError, "missing variables"),
             "lone surrogate": ({"question": "a \udc80 b"}, EngineInputError, "lone surrogate U+DC80"),
             "over-long": ({"question": "lorem ipsum " * 20_000}, EngineInputError, "maximum context length")}
    for case, (value, kind, message) in cases.items():
        for name, call in entry_points.items():
            plain, teola = outcome(lambda: call(chain, value)), outcome(lambda: call(wrapped, value))
            assert type(plain) is type(teola) and isinstance(teola, kind), (case, name, plain, teola)
            assert message in str(teola), (case, name, teola)
    assert wrapped.invoke({"question": "What is the capital of France?"})  # still usable


# -- configuration (no engines) ------------------------------------------------------------------
@MANY
@given(passes=st.one_of(st.none(), anything), disabled=anything, timeout_s=anything, optimize=anything)
def test_executor_config_builds_or_raises_config_error(passes, disabled, timeout_s, optimize):
    try:
        ex = TeolaExecutor(passes=passes, disabled=disabled, timeout_s=timeout_s, optimize=optimize,
                           start_engines=False)
    except ConfigError as exc:
        assert clear(exc, "pass", "timeout_s", "disabled")
    else:
        assert ex.timeout_s is None or ex.timeout_s > 0


@MANY
@given(passes=st.one_of(st.none(), anything), disabled=st.one_of(st.just(()), anything), timeout_s=anything,
       runtime=st.one_of(st.none(), anything))
def test_runnable_config_builds_or_raises_a_clear_error(passes, disabled, timeout_s, runtime):
    try:
        fast = TeolaRunnable(RunnableLambda(lambda x: x), passes=passes, disabled=disabled, timeout_s=timeout_s,
                             runtime=runtime)
    except ConfigError as exc:
        assert clear(exc, "pass", "timeout_s", "runtime", "disabled")
    else:
        assert fast.timeout_s is None or fast.timeout_s > 0


@MANY
@given(hosting=st.one_of(st.sampled_from(["ray", "local"]), anything), engines=st.one_of(st.none(), anything),
       timeline=st.one_of(st.integers(-2, 3), anything), address=st.one_of(st.none(), st.integers(), st.binary()))
def test_runtime_config_builds_or_raises_config_error(hosting, engines, timeline, address):
    try:
        rt = Runtime(engines, hosting=hosting, ray_address=address, timeline_queries=timeline)
    except ConfigError as exc:
        assert clear(exc, "hosting", "engines", "timeline", "ray_address")
    else:
        assert rt.hosting in ("ray", "local") and rt.timeline.max_queries >= 1
        rt.shutdown()  # never started: nothing to stop


def test_executor_ray_address_of_the_wrong_kind_fails_before_connecting():
    for address in ("", "   ", 6379, b"host:1"):
        with pytest.raises(ConfigError, match="ray_address"):
            TeolaExecutor(ray_address=address)
    with pytest.raises(ConfigError, match="either runtime or ray_address"):
        TeolaExecutor(Runtime(hosting="local"), ray_address="host:6379")


def test_timeline_keeps_only_the_last_queries():
    from teola_plugin.runtime.timeline import Span, Timeline

    tl = Timeline(max_queries=3)
    for i in range(10):
        for node in ("a", "b"):
            tl.record(Span(f"q{i}", node, "embed", "embedder", 0.0, 0.0, 1.0))
    assert tl.query_ids() == ["q7", "q8", "q9"] and len(tl) == 6
    assert np.isfinite([s.end for s in tl.spans()]).all()
