"""A lowered chain reports the callback run tree plain LangChain reports (``langchain/run_tree.py``).

The chains are written as LangChain's docs write them, against the session's real vLLM
server (``ChatOpenAI(base_url=...)``) and the real MiniLM embedder; each is invoked plainly
and through ``TeolaRunnable`` with a recording handler, and the two trees are compared run
by run: names, parents, tags, inputs and outputs, nesting and step order. Sequential calls
on an idle server: greedy answers are the same on both sides.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import time

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableBranch, RunnableLambda, RunnableParallel, RunnablePassthrough
from langchain_core.tracers.context import collect_runs
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI

from teola_plugin.langchain import TeolaEmbeddings, TeolaRunnable
from tests.fixtures_served import SERVED_NAME, docs_rag_chain
from tests.test_langchain import QUESTIONS, retriever  # noqa: F401

from .run_trees import RunTreeRecorder


@pytest.fixture
def chat(recording_proxy):
    # Teola's request, identical to plain's, gets plain's reply: decoded again over a cached
    # prefix, a prompt can pick another greedy token on bf16 CPU kernels
    recording_proxy.replay = True
    return ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="none", temperature=0,
                      max_tokens=12)


def same_tree(chain, input, runtime) -> RunTreeRecorder:
    plain, teola = RunTreeRecorder(), RunTreeRecorder()
    expected = chain.invoke(input, {"callbacks": [plain]})
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast._plan(input).uses_engines  # a graph run, not the chain run as it is
    got = fast.invoke(input, {"callbacks": [teola]})
    assert RunTreeRecorder.comparable(got) == RunTreeRecorder.comparable(expected)
    assert teola.tree() == plain.tree()
    assert teola.nested() and plain.nested()
    return teola


def test_the_docs_rag_chain_reports_plains_runs_to_handlers_collect_runs_and_event_streams(
        model_server, retriever, runtime):  # noqa: F811
    chain = docs_rag_chain(retriever, model_server.base_url, max_tokens=12)
    teola = same_tree(chain, QUESTIONS[1], runtime)
    kinds = {path[-1]: kind for path, kind, *_ in teola.tree()}
    assert kinds["StrOutputParser"] == "parser" and kinds["ChatPromptTemplate"] == "prompt"
    assert kinds["VectorStoreRetriever"] == "retriever" and kinds["ChatOpenAI"] == "chat_model"

    # LangSmith-style tracers hear runs through LangChain's configure hooks, not the config
    fast = TeolaRunnable(chain, runtime=runtime)
    collected = []
    for runnable in (chain, fast):
        with collect_runs() as runs:
            runnable.invoke(QUESTIONS[1])
        (root,) = runs.traced_runs
        collected.append(_run_names(root))
    assert collected[1] == collected[0] and len(collected[0]) == 9

    async def events(runnable):
        seen = [(e["event"], e["name"], tuple(sorted(e.get("tags", []))), len(e["parent_ids"]))
                async for e in runnable.astream_events(QUESTIONS[1], version="v2")]
        return sorted(e for e in seen if e[0] != "on_chat_model_stream"), [e for e in seen if e[0] == "on_chat_model_stream"]

    (plain_events, plain_tokens), (teola_events, teola_tokens) = asyncio.run(events(chain)), asyncio.run(events(fast))
    assert teola_events == plain_events and len(plain_events) > 2 * 9  # start + end of each run, + stream events
    assert len(teola_tokens) == len(plain_tokens) > 1


def test_a_retriever_bound_with_config_reports_its_run_name_tags_and_metadata(model_server, retriever,
                                                                              runtime):  # noqa: F811
    """``retriever.with_config(run_name=..., tags=..., metadata=...)`` in the docs' RAG chain:
    the lowered retriever's run carries them, as plain's binding passes them on."""
    named = retriever.with_config(run_name="SquadDocs", tags=["named"], metadata={"source": "squad"})
    chain = docs_rag_chain(named, model_server.base_url, max_tokens=12)
    teola = same_tree(chain, QUESTIONS[1], runtime)
    (tags,) = [tags for path, kind, tags, *_ in teola.tree() if kind == "retriever"]
    assert "named" in tags and any(path[-1] == "SquadDocs" for path, *_ in teola.tree())
    metadata = []
    for runnable in (chain, TeolaRunnable(chain, runtime=runtime)):
        with collect_runs() as runs:
            runnable.invoke(QUESTIONS[1])
        (root,) = runs.traced_runs
        metadata.append([run.extra["metadata"].get("source") for run in _runs(root) if run.run_type == "retriever"])
    assert metadata[1] == metadata[0] == ["squad"]


def test_runs_under_outer_tags_and_bound_tags_carry_them_in_plains_order(model_server, retriever,
                                                                         runtime):  # noqa: F811
    """Invoked with ``tags`` and with a model and a retriever bound ``with_config(tags=...)``: a
    step's run lists its ``seq:step`` tag first, then the call's and its binding's tags, in the
    order plain's callback manager builds them (handlers see the list as it is)."""
    chain = docs_rag_chain(retriever.with_config(tags=["docs"]), model_server.base_url, max_tokens=12)
    chain = chain.first | chain.middle[0] | chain.middle[1].with_config(tags=["inner"]) | chain.last
    plain, teola = RunTreeRecorder(), RunTreeRecorder()
    chain.invoke(QUESTIONS[1], {"callbacks": [plain], "tags": ["outer"]})
    TeolaRunnable(chain, runtime=runtime).invoke(QUESTIONS[1], {"callbacks": [teola], "tags": ["outer"]})
    tags = {path[-1]: tags for path, kind, tags, *_ in plain.tree()}
    assert list(tags["ChatOpenAI"]) == ["seq:step:3", "inner", "outer"]
    assert list(tags["VectorStoreRetriever"])[:3] == ["seq:step:1", "docs", "outer"]  # then the store's own
    assert teola.tree() == plain.tree()


def _runs(run) -> list:
    return [run, *(r for child in run.child_runs for r in _runs(child))]


def test_a_multi_query_retriever_reports_its_chain_and_a_retriever_run_per_query(model_server, retriever,
                                                                                   runtime):  # noqa: F811
    """Plain's ``MultiQueryRetriever`` reports its ``llm_chain``'s runs (the sequence, prompt,
    model, parser) and one run of its retriever per query (the question too, under
    ``include_original``): so does the lowered one, under invoke and ainvoke (which gathers)."""
    from langchain_classic.retrievers.multi_query import MultiQueryRetriever

    llm = ChatOpenAI(model=SERVED_NAME, base_url=model_server.base_url, api_key="none", temperature=0,
                     max_tokens=40)
    for include_original in (False, True):
        mq = MultiQueryRetriever.from_llm(retriever=retriever, llm=llm, include_original=include_original)
        teola = same_tree(mq, QUESTIONS[2], runtime)
        below = [path[1:] for path, *_ in teola.tree()]
        assert {("RunnableSequence", "PromptTemplate"), ("RunnableSequence", "ChatOpenAI"),
                ("RunnableSequence", "LineListOutputParser")} <= set(below)
        (lines,) = [returned for path, _, _, _, returned in teola.tree() if path[1:] == ("RunnableSequence",)]
        searched = [given for path, _, _, given, _ in teola.tree() if path[1:] == ("VectorStoreRetriever",)]
        assert len(searched) == len(ast.literal_eval(lines)) + include_original >= 2
        assert "Opaque components: none" in TeolaRunnable(mq, runtime=runtime).explain(QUESTIONS[2])
    plain, teola = RunTreeRecorder(), RunTreeRecorder()
    expected = _call(mq, "ainvoke", QUESTIONS[2], plain)
    got = _call(TeolaRunnable(mq, runtime=runtime), "ainvoke", QUESTIONS[2], teola)
    assert RunTreeRecorder.comparable(got) == RunTreeRecorder.comparable(expected)
    assert teola.tree() == plain.tree() and teola.nested()


def _run_names(run, depth: int = 0) -> list:
    """A collected run tree as (depth, name, run type, position tags), in the tracer's order."""
    rows = [(depth, run.name, run.run_type, sorted(t for t in run.tags if ":" in t))]
    for child in sorted(run.child_runs, key=lambda r: r.dotted_order):
        rows += _run_names(child, depth + 1)
    return rows


def test_nested_bindings_branches_and_maps_report_their_runs(chat, runtime):
    summarize = ChatPromptTemplate.from_template("Say in three words: {q}") | chat | StrOutputParser()
    explain = ChatPromptTemplate.from_template("Explain briefly: {q}") | chat.with_config(run_name="explainer") | StrOutputParser()
    route = RunnableBranch((lambda x: x["q"].startswith("Why"), explain), summarize)
    answering = RunnablePassthrough.assign(answer=route).with_config(run_name="answering", tags=["answer-tag"])
    chain = answering | RunnableLambda(lambda x: x["answer"].strip())
    teola = same_tree(chain, {"q": "Why is the sky blue?"}, runtime)
    chosen = [(path, tags) for path, _, tags, *_ in teola.tree() if path[-2:] == ("RunnableBranch", "RunnableSequence")]
    assert len(chosen) == 1 and "branch:1" in chosen[0][1] and "answer-tag" in chosen[0][1]
    assert any(path[-3:] == ("RunnableBranch", "RunnableSequence", "explainer") for path, *_ in teola.tree())
    assert any(path[:2] == ("RunnableSequence", "answering") for path, *_ in teola.tree())
    same_tree(chain, {"q": "Clouds are white."}, runtime)  # the default branch

    define = ChatPromptTemplate.from_template("Define in one word: {w}") | chat | StrOutputParser()
    per_word = RunnableLambda(lambda x: [{"w": w} for w in x["words"]]) | define.map()
    teola = same_tree(per_word, {"words": ["rain", "snow"]}, runtime)
    elements = [path for path, *_ in teola.tree() if path[-1] == "ChatOpenAI"]
    assert len(elements) == 2 and all(p[-3:-1] == ("RunnableEach<RunnableSequence>", "RunnableSequence")
                                       for p in elements)


class Errors(RunTreeRecorder):
    def __init__(self):
        super().__init__()
        self.errored: list[tuple[tuple[str, ...], str]] = []

    def on_chain_error(self, error, *, run_id, **kwargs):
        self.errored.append((self.path(run_id), type(error).__name__))

    on_retriever_error = on_chain_error


def test_a_step_that_raises_errors_the_runs_plain_errors(chat, runtime):
    def refuse(text: str) -> str:
        raise ValueError(f"refusing {text[:10]!r}")

    inner = ChatPromptTemplate.from_template("Answer: {q}") | chat | StrOutputParser() | RunnableLambda(refuse)
    chain = {"answer": inner, "q": RunnablePassthrough()} | RunnableLambda(lambda x: x["answer"])
    plain, teola = Errors(), Errors()
    with pytest.raises(ValueError, match="refusing"):
        chain.invoke({"q": "Who wrote Hamlet?"}, {"callbacks": [plain]})
    with pytest.raises(ValueError, match="refusing"):
        TeolaRunnable(chain, runtime=runtime).invoke({"q": "Who wrote Hamlet?"}, {"callbacks": [teola]})
    assert sorted(teola.errored) == sorted(plain.errored) and len(plain.errored) == 4
    assert teola.tree() == plain.tree()  # the runs that ended before, with their outputs


@pytest.mark.parametrize("hook,step", [("on_chain_start", "StrOutputParser"), ("on_chain_end", "ChatPromptTemplate"),
                                       ("on_chain_start", "ChatPromptTemplate")])
def test_a_strict_handler_that_raises_fails_the_call_as_plain(chat, runtime, retriever, hook, step):
    """A handler with ``raise_error = True`` (a guardrail, a policy check) that raises while a
    lowered step's run is reported: LangChain lets its exception through, so plain's call
    raises it (invoke, ainvoke, batch) and errors the runs around that step; Teola's must too
    (it logged the error and returned the answer). A strict handler that raises nothing
    changes nothing."""

    class Strict(Errors):
        raise_error = True

        def __init__(self, fires: bool = True):
            super().__init__()
            self.fires = fires

        def hook(self, *args, run_id, **kwargs):
            if self.fires and self.path(run_id)[-1] == step:
                raise RuntimeError(f"policy violation in {step}")

    def strict(fires: bool = True) -> Strict:
        handler = Strict(fires)
        own = getattr(RunTreeRecorder, hook)

        def checked(*args, run_id, **kwargs):
            own(handler, *args, run_id=run_id, **kwargs)
            handler.hook(*args, run_id=run_id, **kwargs)

        setattr(handler, hook, checked)
        return handler

    chain = ({"context": retriever | (lambda docs: docs[0].page_content), "q": RunnablePassthrough()}
             | ChatPromptTemplate.from_template("{context}\n{q}") | chat | StrOutputParser())
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast._plan(QUESTIONS[0]).uses_engines
    for call in (lambda r, h: r.invoke(QUESTIONS[0], {"callbacks": [h]}),
                 lambda r, h: asyncio.run(r.ainvoke(QUESTIONS[0], {"callbacks": [h]})),
                 lambda r, h: r.batch([QUESTIONS[0]], {"callbacks": [h]})):
        plain, teola = strict(), strict()
        with pytest.raises(RuntimeError, match=f"policy violation in {step}"):
            call(chain, plain)
        with pytest.raises(RuntimeError, match=f"policy violation in {step}"):
            call(fast, teola)
        assert sorted(teola.errored) == sorted(plain.errored) and plain.errored
        assert (("RunnableSequence",), "RuntimeError") in plain.errored
    quiet = strict(fires=False)
    assert fast.invoke(QUESTIONS[0], {"callbacks": [quiet]}) == chain.invoke(QUESTIONS[0]) and not quiet.errored


def test_a_branch_that_fails_while_a_sibling_run_starts_still_ends_that_run(chat, runtime, caplog):
    """A parallel branch raises while the handler is still starting its sibling's run (a slow
    ``on_chain_start``, as a tracer's network call can be): that run must be ended with the
    error as plain's runs are, not left open, and the reporting must not fail on futures the
    cancelled steps were waiting on (it logged InvalidStateError as a failed callback run)."""

    class SlowStart(Errors):
        def __init__(self):
            super().__init__()
            self.open: dict = {}

        def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None, **kwargs):
            super().on_chain_start(serialized, inputs, run_id=run_id, parent_run_id=parent_run_id, tags=tags, **kwargs)
            self.open[run_id] = kwargs.get("name")
            if "map:key:joke" in (tags or []):
                time.sleep(0.3)  # the other branch fails meanwhile

        def on_chain_end(self, outputs, *, run_id, **kwargs):
            super().on_chain_end(outputs, run_id=run_id, **kwargs)
            self.open.pop(run_id, None)

        def on_chain_error(self, error, *, run_id, **kwargs):
            super().on_chain_error(error, run_id=run_id, **kwargs)
            self.open.pop(run_id, None)

    def boom(_: dict) -> str:
        raise ValueError("bad topic")

    joke = ChatPromptTemplate.from_template("Tell me a joke about {topic}") | chat | StrOutputParser()
    chain = RunnableParallel(joke=joke, check=RunnableLambda(boom))
    for _ in range(3):
        handler = SlowStart()
        with caplog.at_level(logging.WARNING, logger="teola_plugin"):
            with pytest.raises(ValueError, match="bad topic"):
                TeolaRunnable(chain, runtime=runtime).invoke({"topic": "cats"}, {"callbacks": [handler]})
        assert handler.open == {}  # every run it heard start has ended or errored
        assert (("RunnableParallel<joke,check>", "boom"), "ValueError") in handler.errored
        assert (("RunnableParallel<joke,check>",), "ValueError") in handler.errored
    assert not [r for r in caplog.records if "callback run" in r.getMessage()], caplog.text


def test_a_search_that_fails_errors_the_retriever_run_and_the_runs_around_it(chat, runtime):
    """A store whose search raises (an entry written by another embedding, of another size):
    the lowered retriever's run errors, then the runs around it, as in plain."""
    store = InMemoryVectorStore(TeolaEmbeddings(runtime=runtime))
    store.add_texts(["Paris is the capital of France."])
    store.store["other"] = {"id": "other", "vector": [1.0, 0.0], "text": "another embedding's", "metadata": {}}
    chain = ({"context": store.as_retriever(), "q": RunnablePassthrough()}
             | ChatPromptTemplate.from_template("{context}\n{q}") | chat)
    plain, teola = Errors(), Errors()
    with pytest.raises(ValueError) as raised:
        chain.invoke("Where is Paris?", {"callbacks": [plain]})
    with pytest.raises(ValueError, match=re.escape(str(raised.value))):
        TeolaRunnable(chain, runtime=runtime).invoke("Where is Paris?", {"callbacks": [teola]})
    assert sorted(teola.errored) == sorted(plain.errored)
    assert (("RunnableSequence", "RunnableParallel<context,q>", "VectorStoreRetriever"), "ValueError") in plain.errored


def test_a_chain_that_is_one_component_is_that_components_run(chat, runtime):
    """A bare model (a lowered call) or a function (an opaque step, forced into a graph run by
    ``timeout_s``) reports its own run in plain, with no chain run around it: so does Teola,
    under invoke, stream and their async forms."""
    for chain, input, options in ((chat, "Hello there", {}), (chat.with_config(run_name="greeter"), "Hi", {}),
                                  (RunnableLambda(lambda x: x + "!"), "a", {"timeout_s": 60})):
        fast = TeolaRunnable(chain, runtime=runtime, **options)
        for call in ("invoke", "stream", "ainvoke", "astream"):
            plain, teola = RunTreeRecorder(), RunTreeRecorder()
            expected, got = _call(chain, call, input, plain), _call(fast, call, input, teola)
            assert RunTreeRecorder.comparable(got) == RunTreeRecorder.comparable(expected)
            # (a streamed run's input and output: plain's transform reports its chunks' sum, which
            # an opaque step's invoke does not; the tree is the same)
            values = call.endswith("invoke") or chain is chat
            assert teola.tree(values) == plain.tree(values) and len(plain.runs) == 1, (call, teola.tree())


def _call(runnable, call: str, input, recorder):
    config = {"callbacks": [recorder]}
    if call == "invoke":
        return runnable.invoke(input, config)
    if call == "stream":
        return list(runnable.stream(input, config))
    if call == "ainvoke":
        return asyncio.run(runnable.ainvoke(input, config))

    async def chunks():
        return [chunk async for chunk in runnable.astream(input, config)]

    return asyncio.run(chunks())
