"""The LCEL chains a LangGraph graph's nodes call run as their own Teola graphs.

A graph is user code: ``TeolaRunnable(graph)`` runs it as LangGraph does (state, reducers,
conditional edges, ``Send``). What its nodes call that Teola can lower — a node that is a
``RunnableParallel`` over ``prompt | ChatOpenAI | parser``, a node function calling ``chain.invoke`` / ``await
chain.ainvoke`` — runs as that chain's graph run: its request sent by the served engine as a
lowered call (not relayed), recorded on the runtime's timeline, with plain's request body,
state, callback run tree, message stream and exception. Against the session's real vLLM server
(through the recording proxy); the graphs run one request at a time where answers are
compared, so batch composition cannot flip a greedy token.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnableParallel

from teola_plugin.langchain import TeolaRunnable
from teola_plugin.runtime.runtime import Runtime
from tests.run_trees import RunTreeRecorder
from tests.test_served_calls import bodies, chat_openai, relayed

pytestmark = pytest.mark.slow

ANSWER = ChatPromptTemplate.from_template("Answer in one short sentence.\nQuestion: {question}\nAnswer:")
SUMMARY = ChatPromptTemplate.from_template("Say it again in five words: {answer}")


class QA(TypedDict):
    question: str
    answer: str
    summary: str


@pytest.fixture(scope="module")
def served_runtime():
    rt = Runtime({}, hosting="local")
    yield rt
    rt.shutdown()


def graph_runs(runtime: Runtime) -> int:
    return len(runtime.timeline.query_ids())


def qa_graph(model, node_async: bool = False, checkpointer=None):
    """``answer`` is a chain node (a RunnableParallel over ``prompt | model | parser``);
    ``summarize`` a function node calling a chain."""
    from langgraph.graph import END, START, StateGraph

    summarize_chain = SUMMARY | model | StrOutputParser()

    def summarize(state: QA) -> dict:
        return {"summary": summarize_chain.invoke({"answer": state["answer"]})}

    async def asummarize(state: QA) -> dict:
        return {"summary": await summarize_chain.ainvoke({"answer": state["answer"]})}

    builder = StateGraph(QA)
    builder.add_node("answer", RunnableParallel(answer=ANSWER | model | StrOutputParser()))
    builder.add_node("summarize", asummarize if node_async else summarize)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "summarize")
    builder.add_edge("summarize", END)
    return builder.compile(checkpointer=checkpointer)


def test_a_graphs_chain_nodes_run_lowered_with_plains_requests_and_state(recording_proxy, served_runtime):
    graph = qa_graph(chat_openai(recording_proxy.base_url, max_tokens=16))
    state = {"question": "What is the capital of France?"}
    plain = graph.invoke(state)
    plain_bodies = bodies(recording_proxy.take())
    assert len(plain_bodies) == 2 and plain["summary"]

    fast = TeolaRunnable(graph, runtime=served_runtime)
    relayed_before, runs_before = relayed(served_runtime), graph_runs(served_runtime)
    assert fast.invoke(state) == plain
    assert bodies(recording_proxy.take()) == plain_bodies
    assert relayed(served_runtime) == relayed_before  # sent as lowered calls, not relayed
    assert graph_runs(served_runtime) - runs_before == 2  # each node's chain: its own graph run
    explained = fast.explain(state)
    assert "run as their own optimized graphs" in explained
    assert ("a LangGraph graph, run as LangGraph runs it (nodes, edges, state, checkpoints); chain nodes: answer; "
            "function nodes: summarize") in explained

    async_graph = qa_graph(chat_openai(recording_proxy.base_url, max_tokens=16), node_async=True)
    fast_async = TeolaRunnable(async_graph, runtime=served_runtime)
    assert asyncio.run(fast_async.ainvoke(state)) == plain
    assert bodies(recording_proxy.take()) == plain_bodies
    assert relayed(served_runtime) == relayed_before and graph_runs(served_runtime) - runs_before == 4
    assert asyncio.run(async_graph.ainvoke(state)) == plain  # the wrappers are inert outside a run
    recording_proxy.take()

    for mode in ("values", ["values", "updates"]):  # the state after each super-step, and each node's update
        streamed = list(fast.stream(state, stream_mode=mode))
        assert streamed == list(graph.stream(state, stream_mode=mode))
        assert len(streamed) == (3 if mode == "values" else 5)
    assert ("updates", {"summarize": {"summary": plain["summary"]}}) in streamed
    assert relayed(served_runtime) == relayed_before


def test_a_graphs_callback_tree_and_message_stream_are_plains(recording_proxy, served_runtime):
    graph = qa_graph(chat_openai(recording_proxy.base_url, max_tokens=16))
    state = {"question": "Name a primary colour."}
    plain_runs, teola_runs = RunTreeRecorder(), RunTreeRecorder()
    plain = graph.invoke(state, {"callbacks": [plain_runs]})
    fast = TeolaRunnable(graph, runtime=served_runtime)
    assert fast.invoke(state, {"callbacks": [teola_runs]}) == plain
    tree = plain_runs.tree()
    assert any(path[-1] == "ChatOpenAI" for path, *_ in tree)  # the lowered calls report their runs
    assert teola_runs.tree() == tree and teola_runs.nested()

    # LangGraph's message stream hears the models' own chunks (ChatOpenAI's: the server's, each
    # converted by its code); a lowered call streams text, so under it the chains run as they
    # are, their requests relayed.
    recording_proxy.take()
    plain_stream = list(graph.stream(state, stream_mode="messages"))
    plain_bodies = bodies(recording_proxy.take())
    relayed_before = relayed(served_runtime)
    streamed = list(fast.stream(state, stream_mode="messages"))
    assert [(type(m), m.content, m.response_metadata, meta["langgraph_node"]) for m, meta in streamed] == \
        [(type(m), m.content, m.response_metadata, meta["langgraph_node"]) for m, meta in plain_stream]
    assert len(plain_stream) > 4  # token by token
    assert relayed(served_runtime) - relayed_before == 2
    assert bodies(recording_proxy.take()) == plain_bodies


class Topics(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]


def test_send_branches_run_their_chains_as_concurrent_graph_runs(recording_proxy, served_runtime):
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    chain = ChatPromptTemplate.from_template("One sentence about {topic}:") \
        | chat_openai(recording_proxy.base_url, max_tokens=12) | StrOutputParser()

    def answer(state: dict) -> dict:
        return {"answers": [chain.invoke({"topic": state["topic"]})]}

    builder = StateGraph(Topics)
    builder.add_node("answer", answer)
    builder.add_conditional_edges(START, lambda s: [Send("answer", {"topic": t}) for t in s["topics"]], ["answer"])
    builder.add_edge("answer", END)
    graph = builder.compile()
    state = {"topics": ["rain", "Paris", "cats"], "answers": []}
    plain = graph.invoke(state)
    plain_bodies = bodies(recording_proxy.take())

    fast = TeolaRunnable(graph, runtime=served_runtime)
    relayed_before, runs_before = relayed(served_runtime), graph_runs(served_runtime)
    got = fast.invoke(state)
    # The branches meet in one server batch in both runs (greedy decoding may round another
    # way in another mix): requests and the state's shape are compared.
    assert got["topics"] == plain["topics"] and len(got["answers"]) == 3 and all(a.strip() for a in got["answers"])
    assert bodies(recording_proxy.take()) == plain_bodies
    assert relayed(served_runtime) == relayed_before and graph_runs(served_runtime) - runs_before == 3
    # The branches' graph runs were in flight together (LangGraph runs Send branches on its
    # threads; nothing in the lowering serializes them). Whole runs, not decodes: the recording
    # proxy hands a streamed reply over whole, so a decode's span on this side is only its end.
    timeline = served_runtime.timeline
    runs = [timeline.spans([qid]) for qid in timeline.query_ids()[-3:]]
    windows = sorted((min(s.start for s in run), max(s.end for s in run)) for run in runs)
    assert all(any(s.op == "llm_decode" and s.engine.startswith("served:") for s in run) for run in runs)
    assert windows[1][0] < windows[0][1]  # the second branch started before the first ended


def test_a_failing_chain_in_a_node_raises_plains_error_and_the_next_run_works(recording_proxy, served_runtime):
    from langgraph.graph import END, START, StateGraph

    model = chat_openai(recording_proxy.base_url, max_tokens=8)

    def refuse(text: str) -> str:
        raise ValueError(f"refused: {text[:10]}")

    failing = ANSWER | model | StrOutputParser() | RunnableLambda(refuse)
    builder = StateGraph(QA)
    builder.add_node("answer", RunnableParallel(answer=failing))
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    graph = builder.compile()
    state = {"question": "Why?"}
    with pytest.raises(ValueError, match="refused"):
        graph.invoke(state)
    fast = TeolaRunnable(graph, runtime=served_runtime)
    runs_before = graph_runs(served_runtime)
    with pytest.raises(ValueError, match="refused"):
        fast.invoke(state)
    assert graph_runs(served_runtime) - runs_before == 1
    recording_proxy.take()
    ok = qa_graph(model)
    assert TeolaRunnable(ok, runtime=served_runtime).invoke(state) == ok.invoke(state)
    recording_proxy.take()


def test_checkpointed_threads_and_the_recursion_limit_behave_as_plain(recording_proxy, served_runtime):
    """LangGraph keeps a thread's state in its checkpointer (``InMemorySaver``) and stops a
    loop at ``recursion_limit``; with the nodes' chains lowered both are as plain."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphRecursionError
    from langgraph.graph import START, StateGraph

    model = chat_openai(recording_proxy.base_url, max_tokens=8)
    plain_graph, teola_graph = qa_graph(model, checkpointer=InMemorySaver()), qa_graph(model, checkpointer=InMemorySaver())
    fast = TeolaRunnable(teola_graph, runtime=served_runtime)
    thread = {"configurable": {"thread_id": "t1"}}
    runs_before = graph_runs(served_runtime)
    for question in ("What is rain?", "What is snow?"):
        assert fast.invoke({"question": question}, thread) == plain_graph.invoke({"question": question}, thread)
    assert graph_runs(served_runtime) - runs_before == 4
    assert fast.get_state(thread).values == plain_graph.get_state(thread).values
    history = [(c.values, c.next) for c in fast.get_state_history(thread)]
    assert history == [(c.values, c.next) for c in plain_graph.get_state_history(thread)] and len(history) > 4

    builder = StateGraph(QA)  # answers forever: LangGraph stops it
    builder.add_node("answer", RunnableParallel(answer=ANSWER | model | StrOutputParser()))
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "answer")
    loop = builder.compile()
    limit = {"recursion_limit": 3}
    with pytest.raises(GraphRecursionError):
        loop.invoke({"question": "Why?"}, limit)
    runs_before = graph_runs(served_runtime)
    with pytest.raises(GraphRecursionError):
        TeolaRunnable(loop, runtime=served_runtime).invoke({"question": "Why?"}, limit)
    assert graph_runs(served_runtime) - runs_before == 3  # each step's chain ran lowered until the limit
    recording_proxy.take()


def test_a_graphs_typed_run_stream_is_plains_with_its_calls_on_the_served_engine(recording_proxy, served_runtime):
    """``stream_events`` / ``astream_events(version="v3")`` (LangGraph's typed run stream, beta)
    on the wrapper: the graph's own run stream, the same messages and output as plain's, its
    model calls sent by the served engine whichever projection pumps it."""
    graph = qa_graph(chat_openai(recording_proxy.base_url, max_tokens=16))
    if "version" not in str(getattr(type(graph), "stream_events", lambda: None).__doc__):
        pytest.skip("this LangGraph has no typed run stream (stream_events version='v3')")
    state = {"question": "Name a primary colour."}

    def drained(run) -> tuple:
        return [str(m.text) for m in run.messages], run.output

    async def adrained(runnable) -> tuple:
        run = await runnable.astream_events(state, version="v3")
        return [str(await m.text) async for m in run.messages], await run.output()

    recording_proxy.take()
    plain = drained(graph.stream_events(state, version="v3"))
    plain_bodies = bodies(recording_proxy.take())
    assert len(plain_bodies) == 2 and plain[1]["summary"] and len(plain[0]) == 2
    fast = TeolaRunnable(graph, runtime=served_runtime)
    sent_before = relayed(served_runtime) + graph_runs(served_runtime)
    assert drained(fast.stream_events(state, version="v3")) == plain
    assert bodies(recording_proxy.take()) == plain_bodies
    assert asyncio.run(adrained(fast)) == asyncio.run(adrained(graph))
    assert bodies(recording_proxy.take()) == sorted(plain_bodies * 2)
    assert relayed(served_runtime) + graph_runs(served_runtime) - sent_before == 4  # Teola's two runs' calls
