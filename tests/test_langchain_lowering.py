"""What the LangChain tracer lowers and what it leaves opaque, and why (tracing only: no
engine runs, so these are cheap; the fidelity of each lowering is tested on real engines
in test_langchain*.py)."""

from __future__ import annotations

import asyncio

import pytest

from langchain_classic.retrievers.multi_query import LineListOutputParser
from langchain_community.llms import VLLM
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser, StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel

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


def parse_step(chain):
    """The lowered parse step of ``chain``'s trace: a function of the reply message."""
    trace = trace_runnable(chain, LAYOUT)
    assert not trace.opaque, trace.opaque
    (step,) = [p for p in trace.graph if p.name.startswith("parse")]
    return lambda message: asyncio.run(step.attrs["fn"](message=message))


def test_any_parser_that_keeps_invoke_is_lowered_and_computes_what_its_invoke_does():
    """The parse step makes plain's ``parse_result([ChatGeneration(message)])`` call: a
    subclass's own ``parse_result``, a Pydantic parser's validation, the refusal check."""
    class Lenient(JsonOutputParser):
        def parse_result(self, result, *, partial=False):
            return {"raw": result[0].text}

    class Answer(BaseModel):
        name: str

    reply = AIMessage(content='```json\n{"name": "Paris"}\n```')
    refused = AIMessage(content="", additional_kwargs={"refusal": "I cannot answer that."})
    for parser in (Lenient(), PydanticOutputParser(pydantic_object=Answer), JsonOutputParser()):
        step = parse_step(PROMPT | llm() | parser)
        assert step(reply) == parser.invoke(reply)
        for bad in (refused, AIMessage(content="not json")):
            try:
                expected = parser.invoke(bad)
            except Exception as exc:  # noqa: BLE001 - the parser's own error, whatever it is
                with pytest.raises(type(exc)):
                    step(bad)
            else:
                assert step(bad) == expected
    assert parse_step(PROMPT | llm() | PydanticOutputParser(pydantic_object=Answer))(reply) == Answer(name="Paris")

    class OwnInvoke(JsonOutputParser):
        def invoke(self, input, config=None, **kwargs):
            return "mine"

    assert opaque_reasons(PROMPT | llm() | OwnInvoke()) == {"OwnInvoke": "OwnInvoke overrides invoke: its own runs"}

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
    assert not trace_runnable(prompt | served.bind(logprobs=True, max_tokens=4), LAYOUT).opaque  # sampling: lowered
    reasons = opaque_reasons(prompt | served.bind(n=2))  # several completions: its own call
    assert any("['n']" in r for r in reasons.values())


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
    # running and inspecting the chain caches values on its components (a lambda's deps, the
    # serialized form callbacks read): none of that is a setting
    used = PROMPT | RunnableLambda(lambda prompt: prompt.to_string()) | StrOutputParser()
    used_trace = trace_runnable(used, LAYOUT)
    used.invoke({"question": "q"}, {"callbacks": [BaseCallbackHandler()]})
    used.get_graph()
    assert not used_trace.stale, used_trace.state.changed()


def test_pick_of_a_known_key_is_the_field_itself():
    from langchain_core.runnables import RunnableParallel

    both = RunnableParallel(answer=PROMPT | llm() | StrOutputParser(), question=RunnableLambda(lambda x: x["question"]))
    trace = trace_runnable(both.pick("answer"), LAYOUT)
    assert not [o for o in trace.opaque if o.component.startswith("RunnablePick")]
    (decode,) = [p for p in trace.graph if p.op.value == "llm_decode"]
    assert trace.output.tokens_from == decode.name and trace.output.fields is None  # the answer streams as the output
    several = trace_runnable(both.pick(["answer", "question"]), LAYOUT)  # an AddableDict of both
    assert not [o for o in several.opaque if o.component.startswith("RunnablePick")]
    assert several.output.fields == ("answer", "question")
    assert opaque_reasons(both.pick(["missing"]))["RunnablePick<missing>"] == "input holds none of ['missing'] (it picks None)"
    assert "RunnablePick<missing>" in opaque_reasons(both.pick("missing"))


def test_an_addable_dict_input_is_traced_by_its_keys_and_passed_on_as_one():
    """What a stream accumulates (a TeolaRunnable behind ``.assign`` or message history) is
    an ``AddableDict``: its keys are the graph's inputs, as a dict's are, and passed on whole
    it is rebuilt as an ``AddableDict``, the object plain passes on."""
    from langchain_core.runnables import RunnablePassthrough
    from langchain_core.runnables.utils import AddableDict

    given = AddableDict(question="q")
    assert InputLayout.of(given).keys == ("question",) and InputLayout.of(given) != LAYOUT
    assert not trace_runnable(PROMPT | llm(), InputLayout.of(given)).opaque
    trace = trace_runnable(RunnablePassthrough() | RunnablePassthrough(), InputLayout.of(given))
    (build,) = [p for p in trace.graph if p.name.startswith("dict")]
    rebuilt = asyncio.run(build.attrs["fn"](question="q"))
    assert type(rebuilt) is AddableDict and rebuilt == given


def test_langchains_own_functions_behind_a_partial_are_not_reported_as_the_users():
    """``trim_messages(...)`` (and ``with_structured_output``'s parser) are LangChain's own
    functions behind a ``functools.partial``: they run as they are without being listed as
    opaque user code; a user's function or partial still is, under its own name."""
    import functools
    import operator

    from langchain_core.messages import trim_messages
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

    from teola_plugin.capture.langchain.tracer import langchains_own

    trimmer = trim_messages(max_tokens=4, token_counter=len, strategy="last")
    assert langchains_own(trimmer.func) and langchains_own(functools.partial(trimmer.func))

    def mine(messages):
        return messages[-4:]

    assert not langchains_own(mine) and not langchains_own(functools.partial(mine))
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history")])
    layout = InputLayout.of({"history": []})
    history = RunnableLambda(operator.itemgetter("history"))
    assert opaque_reasons({"history": history | trimmer} | prompt | llm(), layout) == {}
    reasons = opaque_reasons({"history": history | RunnableLambda(functools.partial(mine))} | prompt | llm(), layout)
    assert list(reasons.values()) == [f"user function ({__name__}.test_langchains_own_functions_behind_a_partial_"
                                      "are_not_reported_as_the_users.<locals>.mine): runs unchanged on the CPU"]
