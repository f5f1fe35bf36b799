"""TeolaRunnable on run-time structure (``.map()``, ``RunnableBranch``), output parsers,
``.bind(stop=...)``, callbacks of lowered model calls, and the opaque-component warning.

Real engines (the session's vLLM and MiniLM), greedy decoding, bundled questions. Where
several LLM calls run at once, vLLM's batched greedy decoding may pick another token than
batch-1 decoding (see test_langchain's batch test), so those answers are checked through
what decides them: the exact prompts, and each later prompt rebuilt by LangChain's own
template from the earlier answers Teola produced.
"""

from __future__ import annotations

import asyncio
import logging
from operator import itemgetter

import pytest
from langchain_classic.retrievers.multi_query import LineListOutputParser
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import OutputParserException
from langchain_core.output_parsers import (CommaSeparatedListOutputParser, JsonOutputParser,
                                           MarkdownListOutputParser, NumberedListOutputParser, StrOutputParser)
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableBranch, RunnableLambda, RunnablePassthrough

from teola_plugin.langchain import TeolaChatModel, TeolaLLM, TeolaRunnable
from tests.test_langchain import QA_TEMPLATE, QUESTIONS, engine_prompts, format_docs, retriever  # noqa: F401

MULTI_HOP = "Which NFL team won Super Bowl 50, and where is the stadium it was played in?"
DECOMPOSE = ("Break the question into two simpler questions. Write one question per line and "
             "nothing else.\nQuestion: {question}\nSimpler questions:\n")
COMBINE = ("Answer the question in one sentence using the notes.\nNotes:\n{notes}\n"
           "Question: {question}\nAnswer:")


@pytest.fixture(scope="module")
def llm(runtime):
    return TeolaLLM(runtime=runtime, max_tokens=10)


@pytest.fixture(scope="module")
def chat(runtime):
    return TeolaChatModel(runtime=runtime, max_tokens=10)


def query_spans(runtime, op):
    """Spans of ``op`` from the most recent query in the timeline."""
    spans = runtime.timeline.spans()
    last = spans[-1].query_id
    return [s for s in spans if s.query_id == last and s.op == op]


# -- RunnableEach (.map()) --------------------------------------------------------------------
def test_map_answers_each_sub_question_with_its_own_sub_graph(runtime, llm, chat, retriever, engine_prompts):
    """The benchmark's multi-hop app: decompose -> answer each sub-question (RAG) -> combine.

    The sub-questions stream into the map while they are decoded, so the decomposition is
    decoded in batches with the first sub-answers' prefills (and batched greedy decoding
    may pick other tokens, see the module doc): each later step is checked against
    LangChain's own templates on the values Teola produced."""
    answer = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
              | ChatPromptTemplate.from_template(QA_TEMPLATE) | chat | StrOutputParser())
    decompose = PromptTemplate.from_template(DECOMPOSE) | TeolaLLM(runtime=runtime, max_tokens=40) \
        | LineListOutputParser()
    combine = PromptTemplate.from_template(COMBINE)
    chain = (RunnablePassthrough.assign(subs=decompose)
             | RunnablePassthrough.assign(answers=itemgetter("subs") | answer.map())
             | RunnablePassthrough.assign(notes=lambda x: "\n".join(x["answers"]))
             | RunnablePassthrough.assign(final=combine | llm | StrOutputParser()))
    fast = TeolaRunnable(chain, runtime=runtime)
    x = {"question": MULTI_HOP}

    engine_prompts.clear()
    expected = chain.invoke(x)
    plain_prompts = list(engine_prompts)
    engine_prompts.clear()
    got = fast.invoke(x)
    teola_prompts = list(engine_prompts)

    subs = got["subs"]
    assert teola_prompts[0] == plain_prompts[0]  # the same decomposition prompt
    assert subs and all(isinstance(q, str) and q for q in subs) and len(got["answers"]) == len(subs)
    # One RAG prompt per sub-question, with the passages LangChain retrieves for it.
    qa = ChatPromptTemplate.from_template(QA_TEMPLATE)
    expected_sub_prompts = [chat.engine_prompt(qa.invoke({"context": format_docs(retriever.invoke(q)),
                                                          "question": q})) for q in subs]
    assert sorted(map(repr, teola_prompts[1:-1])) == sorted(map(repr, expected_sub_prompts))
    assert all(isinstance(a, str) and a for a in got["answers"])
    assert got["notes"] == "\n".join(got["answers"])  # answers in sub-question order
    assert teola_prompts[-1] == combine.invoke(got).to_string()
    assert got["final"] == llm.invoke(teola_prompts[-1])  # one call alone: batch-1 decoding
    if subs == expected["subs"] and got["answers"] == expected["answers"]:
        assert got == expected
    # Decode pipelining: each sub-question's retrieval started while the decomposition was
    # still being decoded (its lines stream into the `.map()`).
    decomposition = min((s for s in query_spans(runtime, "llm_decode") if s.origin == "TeolaLLM"),
                        key=lambda s: s.start)
    assert min(s.start for s in query_spans(runtime, "embed")) < decomposition.end
    plan = fast._plan(x)
    (region,) = [p for p in plan.graph if p.attrs.get("stream_from")]
    assert plan.graph[region.attrs["stream_from"]].attrs["stream_items"]
    explained = fast.explain(x)
    assert "Opaque components" in explained and "LineListOutputParser" not in explained
    steps = explained.split("Data-dependent steps (sub-graph built at run time, optimized the same way):\n")[1]
    assert steps.startswith(f"  - {region.name} (RunnableEach<RunnableSequence>): expands at run time into one "
                            "sub-graph per line, each started as its line is decoded, lowered and optimized")


def test_map_elements_share_engine_batches(runtime, chat, engine_prompts):
    """A list given as input: one sub-graph per element, all started at once."""
    answer = ChatPromptTemplate.from_template("Answer in one word. {question}") | chat | StrOutputParser()
    chain = answer.map()
    fast = TeolaRunnable(chain, runtime=runtime)
    engine_prompts.clear()
    got = fast.invoke(QUESTIONS)
    assert sorted(map(repr, engine_prompts)) == sorted(
        repr(chat.engine_prompt(answer.first.invoke({"question": q}))) for q in QUESTIONS)
    assert len(got) == len(QUESTIONS) and all(isinstance(a, str) and a for a in got)
    # All elements' generations were in flight together (vLLM batches running streams).
    decodes = query_spans(runtime, "llm_decode")
    assert len(decodes) == len(QUESTIONS) and max(s.start for s in decodes) < min(s.end for s in decodes)


def test_map_of_cpu_steps_and_empty_and_bad_inputs(runtime):
    double = RunnableLambda(lambda s: s * 2)
    chain = double.map()
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast.invoke(["a", "b", "c"]) == chain.invoke(["a", "b", "c"]) == ["aa", "bb", "cc"]
    assert fast.invoke([]) == chain.invoke([]) == []
    with pytest.raises(Exception) as plain:
        chain.invoke(5)  # not a sequence: RunnableEach's own error
    with pytest.raises(type(plain.value)) as teola:
        fast.invoke(5)
    assert str(teola.value) == str(plain.value)
    assert fast.batch([[str(i)] for i in range(16)]) == [[str(i) * 2] for i in range(16)]


def test_map_keeps_element_order_and_failures(runtime, llm):
    prompt = PromptTemplate.from_template("{topic}: {question}")
    chain = (prompt | llm | StrOutputParser()).map()
    fast = TeolaRunnable(chain, runtime=runtime)
    bad = [{"topic": "geography", "question": QUESTIONS[1]}, {"question": "no topic"}]
    with pytest.raises(Exception) as plain:
        chain.invoke(bad)
    with pytest.raises(type(plain.value)) as teola:
        fast.invoke(bad)
    assert str(teola.value) == str(plain.value)


# -- RunnableBranch ----------------------------------------------------------------------------
def test_branch_runs_the_branch_its_conditions_choose(runtime, llm, chat, engine_prompts):
    geography = PromptTemplate.from_template("You are a geography teacher.\nQ: {question}\nA:") | llm \
        | StrOutputParser()
    history = ChatPromptTemplate.from_template("You are a historian. {question}") | chat | StrOutputParser()
    calls = []

    def about_places(x):
        calls.append(x["question"])
        return "Where" in x["question"]

    branch = RunnableBranch((about_places, geography),
                            (lambda x: "dynasty" in x["question"], history),
                            RunnableLambda(lambda x: "no branch for " + x["question"]))
    chain = {"question": RunnablePassthrough()} | branch
    fast = TeolaRunnable(chain, runtime=runtime)
    # nothing opaque, and the branch a step whose sub-graph its conditions choose when it runs
    explained = fast.explain(QUESTIONS[1])
    assert "Opaque components: none" in explained
    assert ("  - branch (RunnableBranch): expands at run time into the branch its conditions' own code "
            "chooses, lowered and optimized") in explained
    answered_by_a_model = []
    for q in (QUESTIONS[1], QUESTIONS[3], QUESTIONS[2]):
        engine_prompts.clear()
        expected = chain.invoke(q)
        plain_prompts = list(engine_prompts)
        engine_prompts.clear()
        calls.clear()
        assert fast.invoke(q) == expected
        assert engine_prompts == plain_prompts
        assert calls == [q]  # the condition ran once, by its own code
        if plain_prompts and len(expected) > 8:
            answered_by_a_model.append((q, expected))
    assert answered_by_a_model
    for q, expected in answered_by_a_model:
        chunks = list(fast.stream(q))
        assert "".join(chunks) == expected
        assert len(chunks) > 1  # the chosen branch's tokens stream as decoded, not the answer at once
    with pytest.raises(Exception) as plain:
        branch.invoke({"q": "wrong key"})
    with pytest.raises(type(plain.value)) as teola:
        TeolaRunnable(branch, runtime=runtime).invoke({"q": "wrong key"})
    assert str(teola.value) == str(plain.value)


# -- output parsers --------------------------------------------------------------------------
@pytest.mark.parametrize("parser, instruction", [
    (JsonOutputParser(), 'Reply with a JSON object with keys "city" and "country" only.'),
    (CommaSeparatedListOutputParser(), "List three colours, separated by commas."),
    (NumberedListOutputParser(), "List three colours as a numbered list."),
    (MarkdownListOutputParser(), "List three colours as a markdown list."),
])
def test_output_parsers_run_as_primitives_with_the_same_result(runtime, parser, instruction):
    chat = TeolaChatModel(runtime=runtime, max_tokens=30)
    chain = ChatPromptTemplate.from_messages([("system", instruction), ("human", "{question}")]) | chat | parser
    fast = TeolaRunnable(chain, runtime=runtime)
    x = {"question": QUESTIONS[1]}
    assert "Opaque components: none" in fast.explain(x)
    try:
        expected = chain.invoke(x)
    except OutputParserException as plain:  # the parser's own failure reaches the caller unchanged
        with pytest.raises(OutputParserException) as teola:
            fast.invoke(x)
        assert str(teola.value) == str(plain)
    else:
        assert fast.invoke(x) == expected


def test_json_parser_failure_is_the_parsers_own_exception(runtime, llm):
    chain = PromptTemplate.from_template("The capital of France is") | llm | JsonOutputParser()
    with pytest.raises(OutputParserException) as plain:
        chain.invoke({})
    with pytest.raises(OutputParserException) as teola:
        TeolaRunnable(chain, runtime=runtime).invoke({})
    assert str(teola.value) == str(plain.value)


# -- bind(stop=...), with_config, callbacks, astream_events -----------------------------------
def test_bound_stop_is_sent_to_the_engine(runtime, engine_prompts, monkeypatch):
    llm = TeolaLLM(runtime=runtime, max_tokens=40)
    chain = PromptTemplate.from_template("Count from one to ten in words: one, two,") | llm.bind(stop=[","]) \
        | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    prefill = [p for p in fast.trace({}) if p.op.value == "llm_prefill"][0]
    assert prefill.attrs["sampling_params"]["stop"] == [","]
    expected = chain.invoke({})
    assert fast.invoke({}) == expected and "," not in expected
    assert fast.with_config(tags=["x"]).invoke({}) == expected
    chain_with_config = PromptTemplate.from_template("Say hi:") | llm.with_config(run_name="m") | StrOutputParser()
    assert "Opaque components: none" in TeolaRunnable(chain_with_config, runtime=runtime).explain({})


class LLMRecorder(BaseCallbackHandler):
    def __init__(self):
        self.events: list[tuple] = []

    def on_chat_model_start(self, serialized, messages, **kwargs):
        self.events.append(("chat_start", [[(m.type, m.content) for m in batch] for batch in messages]))

    def on_llm_start(self, serialized, prompts, **kwargs):
        self.events.append(("llm_start", list(prompts)))

    def on_llm_end(self, response, **kwargs):
        self.events.append(("llm_end", response.generations[0][0].text))


def test_lowered_model_calls_reach_callbacks_with_real_prompts_and_outputs(runtime, llm, chat):
    chain = (ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{question}")])
             | chat | StrOutputParser())
    completion = PromptTemplate.from_template("Q: {question}\nA:") | llm | StrOutputParser()
    for c in (chain, completion):
        plain, teola = LLMRecorder(), LLMRecorder()
        expected = c.invoke({"question": QUESTIONS[3]}, {"callbacks": [plain]})
        got = TeolaRunnable(c, runtime=runtime).invoke({"question": QUESTIONS[3]}, {"callbacks": [teola]})
        assert got == expected
        assert teola.events == plain.events and len(teola.events) == 2


def test_astream_events_reports_the_run_and_its_model_call(runtime, chat):
    chain = ChatPromptTemplate.from_template("{question}") | chat | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)

    async def events():
        return [e async for e in fast.astream_events({"question": QUESTIONS[0]}, version="v2")]

    seen = asyncio.run(events())
    kinds = [e["event"] for e in seen]
    assert kinds[0] == "on_chain_start" and kinds[-1] == "on_chain_end"
    assert "on_chain_stream" in kinds and "on_chat_model_start" in kinds and "on_chat_model_end" in kinds
    assert seen[-1]["data"]["output"] == chain.invoke({"question": QUESTIONS[0]})


# -- the opaque-component warning -----------------------------------------------------------------
def test_an_opaque_component_type_is_logged_once_with_the_reason(runtime, caplog):
    class Shout(Runnable):  # a fresh type: never logged before in this session
        def invoke(self, input, config=None, **kwargs):
            return str(input).upper()

    chain = Shout() | RunnableLambda(lambda s: s + "!")
    with caplog.at_level(logging.WARNING, logger="teola_plugin"):
        fast = TeolaRunnable(chain, runtime=runtime)
        assert fast.invoke("hi") == "HI!"
        TeolaRunnable(chain, runtime=runtime).invoke("again")
    shout = [r for r in caplog.records if "Shout" in r.getMessage()]
    assert len(shout) == 1 and shout[0].levelno == logging.WARNING
    assert shout[0].name.startswith("teola_plugin") and "no lowering rule for Shout" in shout[0].getMessage()
