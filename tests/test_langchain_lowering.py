"""What the LangChain tracer lowers and what it leaves opaque, and why (tracing only: no
engine runs, so these are cheap; the fidelity of each lowering is tested on real engines
in test_langchain*.py)."""

from __future__ import annotations

from langchain_classic.retrievers.multi_query import LineListOutputParser
from langchain_community.llms import VLLM
from langchain_core.output_parsers import JsonOutputParser, StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableLambda

from teola_plugin.capture.langchain import InputLayout, trace_runnable
from teola_plugin.langchain import TeolaLLM

PROMPT = PromptTemplate.from_template("Q: {question}\nA:")
LAYOUT = InputLayout.of({"question": "q"})


def llm() -> TeolaLLM:
    return TeolaLLM(runtime=object(), max_tokens=8)  # never called: tracing only


def opaque_reasons(chain, layout=LAYOUT, **kwargs):
    return {o.component: o.reason for o in trace_runnable(chain, layout, **kwargs).opaque}


def test_bound_stop_becomes_the_calls_sampling_parameter_and_other_kwargs_stay_opaque():
    trace = trace_runnable(PROMPT | llm().bind(stop=["\n"]), LAYOUT)
    (prefill,) = [p for p in trace.graph if p.op.value == "llm_prefill"]
    assert prefill.attrs["sampling_params"]["stop"] == ["\n"]
    assert not trace.opaque
    reasons = opaque_reasons(PROMPT | llm().bind(logprobs=True))
    assert any("logprobs" in r for r in reasons.values())


def test_parser_subclasses_run_unchanged():
    class Lenient(JsonOutputParser):
        def parse_result(self, result, *, partial=False):
            return {"raw": result[0].text}

    assert opaque_reasons(PROMPT | llm() | Lenient()) == {"Lenient": "no lowering rule for Lenient"}
    assert opaque_reasons(PROMPT | llm() | JsonOutputParser()) == {}

    class Stripped(StrOutputParser):  # StrOutputParser's rule matches subclasses: it must not skip this parse
        def parse(self, text):
            return text.strip()

    assert "Stripped" in opaque_reasons(PROMPT | llm() | Stripped())
    assert opaque_reasons(PROMPT | llm() | StrOutputParser()) == {}


def test_vllm_is_mapped_only_onto_an_engine_serving_its_model_with_one_completion():
    served = {"llm": "/models/served"}
    same = VLLM.model_construct(model="/models/served", n=2)
    other = VLLM.model_construct(model="/models/other")
    assert "n / best_of" in opaque_reasons(PROMPT | same, engine_models=served)["VLLM"]
    assert "not the model of a Teola LLM engine" in opaque_reasons(PROMPT | other, engine_models=served)["VLLM"]


def test_map_after_a_line_list_of_a_decode_is_pipelined_and_not_after_a_user_function():
    sub = PROMPT | llm() | StrOutputParser()
    lines = PromptTemplate.from_template("List: {question}") | llm() | LineListOutputParser()
    graph = trace_runnable(lines | sub.map(), LAYOUT).graph
    (region,) = [p for p in graph if p.attrs.get("stream_from")]
    assert graph[region.attrs["stream_from"]].attrs["stream_items"] and region.inputs["items"].port == "items"
    graph = trace_runnable(lines | RunnableLambda(lambda qs: qs[:2]) | sub.map(), LAYOUT).graph
    assert not [p for p in graph if p.attrs.get("stream_from") or p.attrs.get("stream_items")]


def test_a_cross_encoder_compressor_runs_unchanged_over_a_lowered_base_retriever():
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
    from langchain_core.vectorstores import InMemoryVectorStore

    from teola_plugin.langchain import TeolaEmbeddings, TeolaReranker

    base = InMemoryVectorStore(TeolaEmbeddings(runtime=object())).as_retriever()
    # model_construct: a real CrossEncoderReranker needs a downloaded cross-encoder model.
    cross = ContextualCompressionRetriever(base_compressor=CrossEncoderReranker.model_construct(top_n=2),
                                           base_retriever=base)
    trace = trace_runnable(cross, InputLayout.of("q"))
    assert [o.component for o in trace.opaque] == ["CrossEncoderReranker"]
    assert "is not a TeolaReranker" in trace.opaque[0].reason
    assert {"embed", "vector_search"} <= {p.op.value for p in trace.graph}
    ours = ContextualCompressionRetriever(base_compressor=TeolaReranker(runtime=object(), top_n=2),
                                          base_retriever=base)
    trace = trace_runnable(ours, InputLayout.of("q"))
    (rerank,) = [p for p in trace.graph if p.op.value == "rerank"]
    assert rerank.engine == "reranker" and rerank.attrs["top_n"] == 2 and not trace.opaque


def test_a_chat_models_bind_and_with_config_are_lowered_like_a_completion_models():
    """``chat_model.bind(stop=...)`` / ``.with_config(...)`` return langchain-core's
    ``_ChatModelBinding`` (a typing-only subclass): lowered as a plain binding."""
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    from teola_plugin.langchain import TeolaChatModel

    prompt = ChatPromptTemplate.from_template("Q: {question}")
    served = ChatOpenAI(model="m", base_url="http://127.0.0.1:9/v1", api_key="none", max_tokens=8)  # never called
    for model in (TeolaChatModel(runtime=object(), max_tokens=8), served):
        for bound in (model.bind(stop=["\n"]), model.with_config(run_name="answer", tags=["t"])):
            trace = trace_runnable(prompt | bound, LAYOUT)
            assert not trace.opaque, (type(model).__name__, trace.opaque)
            assert "llm_decode" in {p.op.value for p in trace.graph}
    reasons = opaque_reasons(prompt | served.bind(logprobs=True))
    assert any("logprobs" in r for r in reasons.values())


def test_a_multi_query_line_no_search_had_runs_the_retrievers_own_search():
    """The last step of a lowered ``MultiQueryRetriever`` reads each of plain's queries from
    the graph's searches; the decode's lines are stripped and the parser's are not, so a query
    with surrounding spaces was not searched: it runs the retriever's own search (real
    MiniLM embeddings, a real store), and the union is plain's, in plain's order."""
    import asyncio

    from langchain_classic.retrievers.multi_query import MultiQueryRetriever
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_huggingface import HuggingFaceEmbeddings

    from teola_plugin.capture.langchain.rules.composite_retrievers import _queries_documents
    from teola_plugin.engines.embedder import default_model_path

    store = InMemoryVectorStore.from_texts(["The Rhine is a river.", "Paris is a city.", "Snow is cold."],
                                           HuggingFaceEmbeddings(model_name=str(default_model_path())))
    retriever = store.as_retriever(search_kwargs={"k": 1})
    mq = MultiQueryRetriever.from_llm(retriever=retriever, llm=llm())
    searched = ["Which river?", "Is snow cold?"]
    lists = [retriever.invoke(q) for q in searched]
    queries = ["Which river?", "  a French city  ", "Is snow cold?"]  # the parser's list
    got = asyncio.run(_queries_documents(mq)(queries=queries, searched=searched, lists=lists))
    expected = mq.unique_union([d for q in queries for d in retriever.invoke(q)])
    assert [d.page_content for d in got] == [d.page_content for d in expected]
    assert [d.page_content for d in got] == ["The Rhine is a river.", "Paris is a city.", "Snow is cold."]


def test_a_trace_goes_stale_when_a_traced_components_setting_changes():
    """A kept plan is reused only while every traced component has the settings it was
    traced with: an in-place edit of a dict field counts, a reuse without edits does not."""
    from langchain_core.embeddings import DeterministicFakeEmbedding  # tracing only: never embeds
    from langchain_core.vectorstores import InMemoryVectorStore

    retriever = InMemoryVectorStore(DeterministicFakeEmbedding(size=8)).as_retriever(search_kwargs={"k": 2})
    chain = PROMPT | llm() | StrOutputParser()
    for component, edit in ((retriever, lambda r: r.search_kwargs.update(k=1)),
                            (retriever, lambda r: setattr(r, "search_type", "mmr")),
                            (chain, lambda c: setattr(c.steps[1], "max_tokens", 4))):
        trace = trace_runnable(component, InputLayout.of("q") if component is retriever else LAYOUT)
        assert not trace.stale and not trace.state.changed()
        edit(component)
        assert trace.stale
        assert trace.state.changed()
    llm_trace = trace_runnable(PROMPT | llm(), LAYOUT)
    llm_trace.graph  # reading the trace changes nothing
    assert not llm_trace.stale
