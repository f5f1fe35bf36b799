"""TeolaRunnable on real engines: the same prompts, documents and outputs as the chain itself.

Every chain here runs twice on the session runtime's engines (vLLM, MiniLM): once as
LangChain runs it (the plugin's models call the engines directly), once traced into
primitives and scheduled by Teola. Greedy decoding, short answers.
"""

from __future__ import annotations

import asyncio
from operator import itemgetter

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from teola_plugin import datasets
from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaLLM, TeolaRunnable
from teola_plugin.errors import ConfigError
from teola_plugin.optimizer import CostModel

from .run_trees import RunTreeRecorder

QUESTIONS = [
    "Which NFL team represented the AFC at Super Bowl 50?",
    "Where did Super Bowl 50 take place?",
    "What is the Rhine?",
    "Who founded the Yuan dynasty?",
]
QA_TEMPLATE = ("You are a helpful assistant. Answer the question using only the context "
               "below, in one short sentence.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


# -- fixtures: models, a store of bundled passages, a prompt recorder -------------------------
@pytest.fixture(scope="module")
def llm(runtime):
    return TeolaLLM(runtime=runtime, max_tokens=12)


@pytest.fixture(scope="module")
def chat(runtime):
    return TeolaChatModel(runtime=runtime, max_tokens=12)


@pytest.fixture(scope="module")
def retriever(runtime):
    passages = datasets.load_corpus("squad-xquad-en")[:30]
    store = InMemoryVectorStore(TeolaEmbeddings(runtime=runtime))
    store.add_texts([p.text for p in passages], metadatas=[{"title": p.title} for p in passages],
                    ids=[p.id for p in passages])
    return store.as_retriever(search_kwargs={"k": 2})


@pytest.fixture
def engine_prompts(runtime, monkeypatch):
    """Every prompt that reaches the LLM engine, from either path (spy on its pool)."""
    pool = runtime.engines("llm")
    seen: list = []
    submit, open_stream = pool.submit, pool.open_stream

    async def spy_submit(op, payload, *args, **kwargs):
        if op == "generate":
            seen.append(payload["prompt"])
        return await submit(op, payload, *args, **kwargs)

    async def spy_open_stream(method, kwargs, *args, **kw):
        seen.append(kwargs["prompt"])
        return await open_stream(method, kwargs, *args, **kw)

    monkeypatch.setattr(pool, "submit", spy_submit)
    monkeypatch.setattr(pool, "open_stream", spy_open_stream)
    return seen


def run_both(chain, fast, inputs, prompts):
    """Outputs and engine prompts of the plain chain and of its Teola run, per input."""
    plain, plain_prompts = [], []
    for x in inputs:
        prompts.clear()
        plain.append(chain.invoke(x))
        plain_prompts.append(list(prompts))
    teola, teola_prompts = [], []
    for x in inputs:
        prompts.clear()
        teola.append(fast.invoke(x))
        teola_prompts.append(list(prompts))
    return plain, plain_prompts, teola, teola_prompts


# -- fidelity ----------------------------------------------------------------------------
def test_prompt_model_parser_sends_the_same_prompt_and_returns_the_same_text(llm, runtime, engine_prompts):
    prompt = PromptTemplate.from_template(
        "You are a geography teacher. Answer in one short sentence.\nQuestion: {question}\nAnswer:")
    chain = prompt | llm | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    inputs = [{"question": q} for q in QUESTIONS[:2]]
    plain, plain_prompts, teola, teola_prompts = run_both(chain, fast, inputs, engine_prompts)
    assert teola_prompts == plain_prompts and all(len(p) == 1 for p in plain_prompts)
    assert teola == plain and all(isinstance(t, str) and t for t in teola)
    fmt = fast.trace(inputs[0])["format"]
    assert fmt.attrs["parts"][0].startswith("You are a geography teacher")  # static prefix visible


def test_rag_chain_retrieves_prompts_and_answers_like_langchain(chat, retriever, runtime, engine_prompts):
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | chat | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    plain, plain_prompts, teola, teola_prompts = run_both(chain, fast, QUESTIONS[:2], engine_prompts)
    assert teola_prompts == plain_prompts
    assert all(p[0][0]["content"].count("\n\n") >= 3 for p in teola_prompts)  # 2 passages in context
    assert teola == plain
    traced = list(fast.trace(QUESTIONS[0]))
    # retriever_start (its callback run), the search, retriever_end
    assert [p.op.value for p in traced][:6] == ["opaque", "aggregate", "embed", "vector_search", "aggregate", "opaque"]
    # The call, its two reports to LangChain callbacks (llm_start / llm_end), and the parser's
    # result, the reply's .text (a TextAccessor, as plain's StrOutputParser returns).
    assert [p.name for p in traced][-6:] == ["format", "llm_start", "llm_prefill", "llm_decode", "llm_end",
                                             "message_text"]


def test_rag_with_sources_returns_the_same_documents(chat, retriever, runtime):
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    answer = (RunnableLambda(lambda x: {"context": format_docs(x["context"]), "question": x["question"]})
              | prompt | chat | StrOutputParser())
    chain = ({"context": retriever, "question": RunnablePassthrough()}
             | RunnablePassthrough.assign(answer=answer))
    fast = TeolaRunnable(chain, runtime=runtime)
    for q in QUESTIONS[:2]:
        expected, got = chain.invoke(q), fast.invoke(q)
        assert list(got) == ["context", "question", "answer"]
        assert got["context"] == expected["context"] and len(got["context"]) == 2
        assert all(isinstance(d, Document) and d.id for d in got["context"])
        assert got == expected


def test_chat_model_output_is_a_message_with_the_same_content(chat, runtime):
    chain = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{question}")]) | chat
    fast = TeolaRunnable(chain, runtime=runtime)
    expected, got = chain.invoke({"question": QUESTIONS[3]}), fast.invoke({"question": QUESTIONS[3]})
    assert type(got) is type(expected) and got.content == expected.content
    composed = fast | RunnableLambda(lambda message: message.content.upper())  # composes like any Runnable
    assert composed.invoke({"question": QUESTIONS[3]}) == expected.content.upper()


# -- batch, async, stream ---------------------------------------------------------------------
def test_a_batch_keeps_order_and_sends_the_same_documents_and_prompts(chat, retriever, runtime, engine_prompts):
    """Answers are not compared token for token here: vLLM's batched greedy decoding can pick
    another token than batch-1 decoding (measured: LangChain's own chain.batch differs from
    its sequential invokes in 4 of 16 such answers). What decides an answer is compared:
    the documents and the exact prompts, and the order of the outputs. Four questions: enough
    to share engine batches (16 took 4 min on a slow 2-core machine)."""
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | RunnablePassthrough.assign(answer=prompt | chat | StrOutputParser()))
    questions = [q.question for q in datasets.load_questions("squad-xquad-en", limit=4, seed=1)]
    contexts = (retriever | format_docs).batch(questions)  # what the chain retrieves (no LLM)
    expected_prompts = [chat.engine_prompt(prompt.invoke({"context": c, "question": q}))
                        for c, q in zip(contexts, questions)]
    engine_prompts.clear()
    got = TeolaRunnable(chain, runtime=runtime).batch(questions)
    assert [g["question"] for g in got] == questions
    assert [g["context"] for g in got] == contexts
    assert all(isinstance(g["answer"], str) and g["answer"] for g in got)
    assert sorted(map(repr, engine_prompts)) == sorted(map(repr, expected_prompts))
    # The queries shared engine batches: some embed call carried several queries.
    spans = [s for s in runtime.timeline.spans() if s.op == "embed"][-len(questions):]
    assert max(s.batch_size for s in spans) > 1


def test_async_invoke_and_batch(llm, runtime, engine_prompts):
    prompt = PromptTemplate.from_template("Q: {question}\nA:")
    chain = RunnablePassthrough.assign(answer=prompt | llm | StrOutputParser())
    fast = TeolaRunnable(chain, runtime=runtime)
    inputs = [{"question": q} for q in QUESTIONS[:3]]
    expected = chain.invoke(inputs[0])

    async def main():
        return await fast.ainvoke(inputs[0]), await fast.abatch(inputs)

    engine_prompts.clear()
    one, many = asyncio.run(main())
    assert one == expected
    assert [m["question"] for m in many] == QUESTIONS[:3]  # in order (answers: see the batch test)
    assert sorted(engine_prompts[1:]) == sorted(prompt.invoke(x).to_string() for x in inputs)


def test_stream_yields_tokens_as_decoded(chat, retriever, runtime):
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | chat | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    whole = fast.invoke(QUESTIONS[0])
    chunks = list(fast.stream(QUESTIONS[0]))
    assert len(chunks) > 3 and "".join(chunks) == whole

    async def collect():
        return [c async for c in fast.astream(QUESTIONS[0])]

    achunks = asyncio.run(collect())
    assert len(achunks) > 3 and "".join(achunks) == whole


def test_plugin_models_stream_without_the_wrapper(chat, llm):
    chunks = list(chat.stream("Name three colours."))
    assert len(chunks) > 3 and "".join(c.content for c in chunks) == chat.invoke("Name three colours.").content
    pieces = list(llm.stream("The capital of France is"))
    assert len(pieces) > 3 and "".join(pieces) == llm.invoke("The capital of France is")


# -- inspection, callbacks, errors ---------------------------------------------------------------
def test_graph_and_explain_show_primitives_and_opaque_components(chat, retriever, runtime):
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | chat | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    mermaid = fast.primitive_graph().draw_mermaid()
    for primitive in ("embed", "vector_search", "format", "llm_prefill", "llm_decode", "format_docs"):
        assert primitive in mermaid
    # get_graph is the chain's own, as plain's (its components, not Teola's primitives)
    assert fast.get_graph().draw_mermaid() == chain.get_graph().draw_mermaid()
    explanation = fast.explain()
    assert "prune_dependencies" in explanation
    assert "format_docs" in explanation and "user function" in explanation
    unknown = RunnableLambda(lambda x: x).with_retry()  # no rule for RunnableRetry
    assert "no lowering rule" in TeolaRunnable(unknown | chain, runtime=runtime).explain("q")


def test_callbacks_hear_the_run_tree_plain_reports(chat, retriever, runtime):
    """Every run plain reports (the nested sequence, the parallel and its passthrough, the
    parser Teola lowered away, the opaque function, the retriever, prompt and model), under
    the same parent, with the same tags, inputs and outputs, nested and in step order."""
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    rag = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | chat | StrOutputParser()
    assign = (RunnablePassthrough.assign(context=itemgetter("question") | retriever | format_docs)
              | prompt | chat.with_config(run_name="answerer") | StrOutputParser())
    paths = {}
    for chain, question in ((rag.with_config(run_name="fast-rag"), QUESTIONS[1]),
                            (assign, {"question": QUESTIONS[1]})):
        plain, teola = RunTreeRecorder(), RunTreeRecorder()
        expected = chain.invoke(question, {"callbacks": [plain]})
        assert TeolaRunnable(chain, runtime=runtime).invoke(question, {"callbacks": [teola]}) == expected
        assert teola.tree() == plain.tree() and len(plain.runs) >= 9
        assert teola.nested() and plain.nested()
        paths.update({path[-1]: path for path, *_ in teola.tree()})
    assert paths["format_docs"] == ("RunnableSequence", "RunnableAssign<context>", "RunnableParallel<context>",
                                    "RunnableSequence", "format_docs")
    assert paths["answerer"] == ("RunnableSequence", "answerer")


def test_inputs_the_chain_rejects_are_rejected_the_same_way(llm, runtime):
    chain = PromptTemplate.from_template("{topic}: {question}") | llm | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    for bad in ({"question": "only one of two"}, "a bare string for two variables"):
        with pytest.raises(Exception) as plain:
            chain.invoke(bad)
        with pytest.raises(type(plain.value)) as teola:
            fast.invoke(bad)
        assert str(teola.value) == str(plain.value)
    with pytest.raises(TypeError, match="Runnable"):
        TeolaRunnable(lambda x: x)


def test_multi_query_retriever_expands_streams_and_unions_like_langchain(runtime, retriever, caplog):
    import logging

    from langchain_classic.retrievers.multi_query import MultiQueryRetriever

    expander = TeolaLLM(runtime=runtime, max_tokens=40)
    mq = MultiQueryRetriever.from_llm(retriever=retriever, llm=expander)
    # Planned as if each engine had its own hardware (the runtime's own cost model declines
    # decode pipelining on this CPU-only machine), so the pipelined path runs for real.
    fast = TeolaRunnable(mq, runtime=runtime, cost_model=CostModel.default())
    question = QUESTIONS[2]
    logs = []
    for run in (mq, fast):  # the docs turn its logger on to see the queries: the same line
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="langchain_classic.retrievers.multi_query"):
            logs.append((run.invoke(question), [r.getMessage() for r in caplog.records
                                                if r.name == "langchain_classic.retrievers.multi_query"]))
    (expected, plain_log), (got, teola_log) = logs
    assert got == expected and len(got) >= 2
    assert teola_log == plain_log and plain_log[0].startswith("Generated queries: [")
    plan = fast._plan(question)
    (decode,) = [p for p in plan.graph if p.op.value == "llm_decode"]
    assert decode.attrs["parse"] == "lines" and decode.attrs["stream_items"]  # pipelined retrieval
    (cpu_decode,) = [p for p in TeolaRunnable(mq, runtime=runtime)._plan(question).graph if p.op.value == "llm_decode"]
    assert not cpu_decode.attrs.get("stream_items")  # the runtime's own plan: one CPU, nothing to overlap
    with pytest.raises(ConfigError, match="cost_model"):
        TeolaRunnable(mq, runtime=runtime, cost_model="fast")
    assert "Opaque components: none" in fast.explain(question)
