"""Model-server calls made by code Teola runs as it is go through Teola's served engines.

Apps as the frameworks' docs write them — a LangGraph graph with ``Send`` fan-out and a
tool-calling node, a LlamaIndex ``Workflow`` and ``FunctionAgent`` — against the session's
real vLLM server (through the recording proxy). Their nodes and steps are user code, so
they run as they are; the requests their ``ChatOpenAI`` / ``OpenAILike`` make must be sent by
the runtime's served engine (its ``relayed`` count), with the same bodies, answers, streams
and events as plain, and plain's exception types on failure.
"""

from __future__ import annotations

import asyncio
import json
import operator
import time
from typing import Annotated, TypedDict

import httpx
import openai
import pytest
from llama_index.core import Settings

from teola_plugin.langchain import TeolaRunnable
from teola_plugin.llama_index import TeolaExecutor
from teola_plugin.runtime.runtime import Runtime
from tests.fixtures_served import SERVED_NAME

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served_runtime():
    """Served engines live in the driver's loop whatever the hosting: no Ray needed here."""
    rt = Runtime({}, hosting="local")
    yield rt
    rt.shutdown()


@pytest.fixture(autouse=True)
def plain_settings():
    Settings.executor = None
    yield
    Settings.executor = None


def relayed(runtime: Runtime) -> int:
    """Requests the runtime's served engines relayed for framework code, over all servers."""
    served = [name for name in runtime.specs if name.startswith("served:") and name in runtime._pools]
    return sum(runtime.run_sync(runtime.engines(name).call("describe"))["relayed"] for name in served)


def assert_server_and_engines_idle(model_server, runtime: Runtime) -> None:
    """After a cancel: the server aborted the request, no served engine keeps a slot, a queue
    entry or a stream for it."""
    for _ in range(50):  # the served engine closed the stream: the server aborts it
        if server_requests_running(model_server) == 0:
            break
        time.sleep(0.2)
    assert server_requests_running(model_server) == 0
    served = [name for name in runtime.specs if name.startswith("served:") and name in runtime._pools]
    stats = [s for name in served for s in runtime.run_sync(runtime.engines(name).stats())]
    assert stats and all(s["running"] == s["queued"] == s["open_streams"] == 0 for s in stats), stats


def server_requests_running(model_server) -> float:
    """What the vLLM server itself is generating now (its /metrics)."""
    metrics = httpx.get(f"http://127.0.0.1:{model_server.port}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("vllm:num_requests_running"))


async def generating_for(model_server, run) -> None:
    """Wait until the server generates for ``run`` (a task or a workflow handler), which is
    still running: the moment to cancel it (bounded: 60 s)."""
    generating = 0.0
    for _ in range(300):
        await asyncio.sleep(0.2)
        generating = await asyncio.to_thread(server_requests_running, model_server)
        if generating or run.done():
            break
    assert generating == 1 and not run.done(), "the generation should be running when cancelled"


def bodies(requests: list[tuple[str, dict]]) -> list[str]:
    return sorted(json.dumps([path, body], sort_keys=True) for path, body in requests)


def chat_openai(base_url: str, **kwargs):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url, api_key="EMPTY",
                      **{"model": SERVED_NAME, "temperature": 0.0, "max_tokens": 12, **kwargs})


# ------------------------------------------------------------------------------ LangGraph
class Topics(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]


def fan_out_graph(model):
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    def answer(state: dict) -> dict:
        return {"answers": [model.invoke(f"One sentence about {state['topic']}:").content]}

    builder = StateGraph(Topics)
    builder.add_node("answer", answer)
    builder.add_conditional_edges(START, lambda s: [Send("answer", {"topic": t}) for t in s["topics"]], ["answer"])
    builder.add_edge("answer", END)
    return builder.compile()


def fan_out_shape(state: dict) -> tuple:
    """A fan-out's state with each answer reduced to whether it has text."""
    return state["topics"], [bool(a.strip()) for a in state["answers"]]


def test_a_langgraph_fan_out_sends_its_model_calls_through_the_served_engine(recording_proxy, served_runtime):
    graph = fan_out_graph(chat_openai(recording_proxy.base_url))
    state = {"topics": ["rain", "Paris", "cats"], "answers": []}
    plain = graph.invoke(state)
    plain_bodies = bodies(recording_proxy.take())

    fast = TeolaRunnable(graph, runtime=served_runtime)
    before = relayed(served_runtime)
    # The branches' requests reach the server at once in both runs, and greedy decoding on a
    # CPU may pick other tokens in another batch mix (plain against plain too): the requests
    # and the state's shape are compared here, the answers in the sequential tests below.
    assert fan_out_shape(fast.invoke(state)) == fan_out_shape(plain)
    assert relayed(served_runtime) - before == 3
    assert bodies(recording_proxy.take()) == plain_bodies and len(plain_bodies) == 3
    assert fan_out_shape(asyncio.run(fast.ainvoke(state))) == fan_out_shape(plain)
    assert relayed(served_runtime) - before == 6
    assert bodies(recording_proxy.take()) == plain_bodies
    assert "served engines" in fast.explain(state)


def test_streamed_messages_of_a_graph_are_relayed_chunk_by_chunk_as_plain(recording_proxy, served_runtime):
    graph = fan_out_graph(chat_openai(recording_proxy.base_url))
    state = {"topics": ["rain"], "answers": []}

    def texts(chunks) -> list[tuple[str, str]]:
        return [(meta["langgraph_node"], message.content) for message, meta in chunks]

    plain = list(graph.stream(state, stream_mode="messages"))
    plain_bodies = bodies(recording_proxy.take())
    fast = TeolaRunnable(graph, runtime=served_runtime)
    before = relayed(served_runtime)
    streamed = list(fast.stream(state, stream_mode="messages"))
    assert texts(streamed) == texts(plain) and len(plain) > 3  # token by token, not one final chunk
    assert relayed(served_runtime) - before == 1
    assert bodies(recording_proxy.take()) == plain_bodies and json.loads(plain_bodies[0])[1]["stream"] is True

    async def astream() -> list:
        return [c async for c in fast.astream(state, stream_mode="messages")]

    assert texts(asyncio.run(astream())) == texts(plain)
    assert [m.usage_metadata for m, _ in streamed if m.usage_metadata] == \
        [m.usage_metadata for m, _ in plain if m.usage_metadata]


def test_a_graph_wrapped_whole_streams_batches_and_reports_events_as_plain(recording_proxy, served_runtime):
    """A graph is one opaque step: the wrapper runs it as it is — LangGraph's own stream
    (``updates`` by default), batch and event tree, no extra wrapper run — while its model
    calls are relayed."""
    graph = fan_out_graph(chat_openai(recording_proxy.base_url, max_tokens=6))
    state = {"topics": ["rain", "Paris"], "answers": []}
    fast = TeolaRunnable(graph, runtime=served_runtime)
    assert not fast._plan(state).uses_engines

    def updates(chunks) -> list:  # per node, each answer reduced to having text (branches run at once)
        return sorted((node, [bool(a) for a in update["answers"]]) for c in chunks for node, update in c.items())

    before = relayed(served_runtime)
    assert updates(fast.stream(state)) == updates(graph.stream(state)) == [("answer", [True])] * 2
    assert [fan_out_shape(s) for s in fast.batch([state, state])] == \
        [fan_out_shape(s) for s in graph.batch([state, state])]

    async def events(runnable) -> list[tuple[str, str]]:
        return sorted([(e["event"], e["name"]) async for e in runnable.astream_events(state, version="v2")])

    assert asyncio.run(events(fast)) == asyncio.run(events(graph))
    assert relayed(served_runtime) - before == 2 + 4 + 2


def test_a_tool_calling_graph_gets_the_same_tool_calls_and_messages(recording_proxy, served_runtime):
    """The agent loop as LangGraph's docs write it: a model with tools -> ToolNode -> the answer.
    ``tool_choice="required"`` makes the bundled model's tool call valid by construction."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    model = chat_openai(recording_proxy.base_url)
    # room for the constrained JSON (the model pads it with whitespace)
    with_tools = chat_openai(recording_proxy.base_url, max_tokens=80).bind_tools([population], tool_choice="required")
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda s: {"messages": [with_tools.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode([population]))
    builder.add_node("answer", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", "answer")
    builder.add_edge("answer", END)
    graph = builder.compile()
    question = {"messages": [HumanMessage("How many people live in Paris?")]}

    def shape(state: dict) -> list:  # tool call ids are the server's random ones
        return [(m.type, m.content, [(c["name"], c["args"]) for c in getattr(m, "tool_calls", [])])
                for m in state["messages"]]

    plain = graph.invoke(question)
    recording_proxy.take()
    before = relayed(served_runtime)
    fast = TeolaRunnable(graph, runtime=served_runtime).invoke(question)
    assert shape(fast) == shape(plain)
    assert fast["messages"][1].tool_calls[0]["name"] == "population"
    call, result = fast["messages"][1].tool_calls[0], fast["messages"][2]
    assert result.type == "tool" and result.tool_call_id == call["id"]
    assert relayed(served_runtime) - before == 2
    sent = [body for _, body in recording_proxy.take()]
    assert sent[0]["tool_choice"] == "required" and sent[0]["tools"][0]["function"]["name"] == "population"


def test_an_interrupted_graph_resumes_as_plain(recording_proxy, served_runtime):
    """Human in the loop as LangGraph's docs write it: a node calls ``interrupt(...)``, the
    run stops with ``__interrupt__`` in its result and its state in the checkpointer, and
    ``Command(resume=...)`` on the same thread goes on from there, the answer's model call
    relayed by the served engine."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    model = chat_openai(recording_proxy.base_url)

    class Draft(TypedDict):
        topic: str
        approved: str
        answer: str

    def approve(state: Draft) -> dict:
        return {"approved": interrupt(f"Write about {state['topic']}?")}

    def write(state: Draft) -> dict:
        return {"answer": model.invoke(f"One sentence about {state['topic']} ({state['approved']}):").content}

    def graph():
        builder = StateGraph(Draft)
        builder.add_node("approve", approve)
        builder.add_node("write", write)
        builder.add_edge(START, "approve")
        builder.add_edge("approve", "write")
        builder.add_edge("write", END)
        return builder.compile(checkpointer=InMemorySaver())

    def run(app) -> tuple:
        thread = {"configurable": {"thread_id": "t1"}}
        paused = app.invoke({"topic": "rain"}, thread)
        waiting = app.get_state(thread).next
        done = app.invoke(Command(resume="yes"), thread)
        return [i.value for i in paused["__interrupt__"]], waiting, done

    plain = run(graph())
    plain_bodies = bodies(recording_proxy.take())
    before = relayed(served_runtime)
    assert run(TeolaRunnable(graph(), runtime=served_runtime)) == plain
    assert plain[0] == ["Write about rain?"] and plain[1] == ("approve",) and plain[2]["approved"] == "yes"
    assert relayed(served_runtime) - before == 1 and bodies(recording_proxy.take()) == plain_bodies


def test_parallel_tool_calls_run_concurrently_with_their_model_calls_relayed(recording_proxy, served_runtime):
    """An agent's message with two tool calls: LangGraph's ``ToolNode`` runs them at once, and
    under Teola they still overlap, each tool's own model call sent by the served engine."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    model = chat_openai(recording_proxy.base_url, max_tokens=24)
    spans: dict[str, tuple[float, float]] = {}

    @tool
    def describe(city: str) -> str:
        """One sentence about a city."""
        start = time.monotonic()
        text = model.invoke(f"One sentence about {city}:").content
        spans[city] = (start, time.monotonic())
        return text

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([describe]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile()
    calls = [{"name": "describe", "args": {"city": city}, "id": f"call_{city}", "type": "tool_call"}
             for city in ("Paris", "Rome")]
    question = {"messages": [AIMessage("", tool_calls=calls)]}

    plain = graph.invoke(question)
    plain_bodies = bodies(recording_proxy.take())
    spans.clear()
    before = relayed(served_runtime)
    fast = TeolaRunnable(graph, runtime=served_runtime).invoke(question)
    assert [(m.type, m.tool_call_id) for m in fast["messages"][1:]] == [(m.type, m.tool_call_id)
                                                                       for m in plain["messages"][1:]]
    assert relayed(served_runtime) - before == 2 and bodies(recording_proxy.take()) == plain_bodies
    (a_start, a_end), (b_start, b_end) = spans["Paris"], spans["Rome"]
    assert a_start < b_end and b_start < a_end  # the two tools ran at once


def test_a_prebuilt_react_agent_runs_as_plain_with_its_model_calls_lowered(recording_proxy, served_runtime):
    """LangGraph's prebuilt agent loop (``create_react_agent``: model with tools -> tools ->
    model ...), tool choice left to the model as the docs write it: the same messages as
    plain; its model node calls ``prompt | model.bind_tools(...)``, an LCEL chain, which runs
    as a graph run of its own (``called_chains``), every request sent by the served engine."""
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    agent = create_react_agent(chat_openai(recording_proxy.base_url, max_tokens=40), [population])
    question = {"messages": [("user", "Use the population tool: how many people live in Paris?")]}

    def shape(state: dict) -> list:  # tool call ids are the server's random ones
        return [(m.type, m.content, [(c["name"], c["args"]) for c in getattr(m, "tool_calls", [])])
                for m in state["messages"]]

    plain = agent.invoke(question)
    plain_calls = len(recording_proxy.take())
    before, runs_before = relayed(served_runtime), len(served_runtime.timeline.query_ids())
    fast = TeolaRunnable(agent, runtime=served_runtime)
    assert shape(fast.invoke(question)) == shape(plain)
    lowered = len(served_runtime.timeline.query_ids()) - runs_before
    assert relayed(served_runtime) - before + lowered == len(recording_proxy.take()) == plain_calls >= 1
    assert lowered >= 1


def test_a_v1_agent_runs_as_plain_with_every_model_request_sent_by_teola(recording_proxy, served_runtime):
    """``langchain.agents.create_agent`` (LangChain v1's agent, as its docs build it: a model,
    a tool, a system prompt), tool choice left to the model: the same messages as plain; its
    model node calls the tool-bound model itself, so each request is relayed by the served
    engine with plain's body."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    @tool
    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    agent = create_agent(chat_openai(recording_proxy.base_url, max_tokens=40), [population],
                         system_prompt="Use your tools to answer.")
    question = {"messages": [("user", "How many people live in Paris? Use the population tool.")]}

    def shape(state: dict) -> list:  # tool call ids are the server's random ones
        return [(m.type, m.content, [(c["name"], c["args"]) for c in getattr(m, "tool_calls", [])])
                for m in state["messages"]]

    recording_proxy.take()
    plain = agent.invoke(question)
    sent_plain = recording_proxy.take()
    before = relayed(served_runtime)
    fast = TeolaRunnable(agent, runtime=served_runtime)
    assert shape(fast.invoke(question)) == shape(plain)
    sent = recording_proxy.take()
    assert relayed(served_runtime) - before == len(sent) == len(sent_plain) >= 1
    assert json.dumps(sent[0], sort_keys=True) == json.dumps(sent_plain[0], sort_keys=True)  # tools, system prompt
    assert shape(asyncio.run(fast.ainvoke(question))) == shape(plain)


def test_a_v1_agent_past_its_recursion_limit_or_with_a_failing_tool_behaves_as_plain(recording_proxy,
                                                                                     served_runtime):
    """A model that must call a tool every turn (``tool_choice="required"``: valid by
    construction) loops until LangGraph's ``recursion_limit`` stops it; a tool that raises
    ends as plain's agent ends (its ``ToolNode``'s error handling). The next run answers."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError

    @tool
    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    @tool
    def census(city: str) -> str:
        """The census of a city."""
        raise RuntimeError(f"the census office of {city} is closed")

    def forced(tools):  # room for the constrained JSON
        return create_agent(chat_openai(recording_proxy.base_url, max_tokens=80,
                                        model_kwargs={"tool_choice": "required"}), tools)

    question = {"messages": [("user", "How many people live in Paris?")]}
    limit = {"recursion_limit": 4}
    with pytest.raises(GraphRecursionError):
        forced([population]).invoke(question, limit)
    sent_plain = recording_proxy.take()
    before = relayed(served_runtime)
    with pytest.raises(GraphRecursionError):
        TeolaRunnable(forced([population]), runtime=served_runtime).invoke(question, limit)
    sent = recording_proxy.take()
    assert relayed(served_runtime) - before == len(sent) == len(sent_plain) >= 2
    assert sent[0] == sent_plain[0] and sent[0][1]["tool_choice"] == "required"

    def outcome(run) -> tuple:
        try:
            state = run({"messages": [("user", "What does the census say about Paris?")]}, {"recursion_limit": 3})
        except Exception as exc:  # noqa: BLE001 - compared with plain's, whatever it is
            return type(exc).__name__, str(exc)
        return "state", [(m.type, m.content) for m in state["messages"] if m.type == "tool"]

    plain = outcome(forced([census]).invoke)
    assert outcome(TeolaRunnable(forced([census]), runtime=served_runtime).invoke) == plain
    assert "closed" in str(plain)  # the tool's own error reached the end, in plain as under Teola
    recording_proxy.take()
    model = chat_openai(recording_proxy.base_url)
    assert TeolaRunnable(model, runtime=served_runtime).invoke("Hi").content == model.invoke("Hi").content


def test_a_cancelled_graph_run_stops_its_request_on_the_server_and_the_next_run_works(model_server,
                                                                                    served_runtime):
    """The node is sync, so under ``ainvoke`` LangGraph runs it in a thread that cancelling the
    run does not stop: plain's request generates on to its end (minutes here). The served-call
    scope cancels what the run's threads wait for when the run ends early."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    base_url = f"http://127.0.0.1:{model_server.port}/v1"
    # a reply that outlasts the test on any machine unless it is aborted
    long = chat_openai(base_url, max_tokens=1500, extra_body={"min_tokens": 1500})
    builder = StateGraph(MessagesState)
    builder.add_node("write", lambda s: {"messages": [long.invoke(s["messages"])]})
    builder.add_edge(START, "write")
    builder.add_edge("write", END)
    fast = TeolaRunnable(builder.compile(), runtime=served_runtime)

    async def cancel_mid_generation() -> float:
        task = asyncio.ensure_future(fast.ainvoke({"messages": [("user", "Count: 1, 2, 3,")]}))
        await generating_for(model_server, task)
        cancelled = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cancelled

    assert server_requests_running(model_server) == 0
    cancelled = asyncio.run(cancel_mid_generation())
    assert_server_and_engines_idle(model_server, served_runtime)
    assert time.monotonic() - cancelled < 10  # aborted, not generated to its end
    model = chat_openai(base_url)
    assert TeolaRunnable(model, runtime=served_runtime).invoke("Hi").content == model.invoke("Hi").content


def test_langchains_stateful_and_retrying_wrappers_run_as_plain_with_their_chains_on_teola(
        recording_proxy, served_runtime):
    """Wrappers users put around a chain, as LangChain's how-to guides write them, run as they
    are: ``RunnableWithMessageHistory`` (a chat chain with a session store) reads and writes
    plain's history, and the chain it calls runs lowered, one graph run per turn;
    ``with_fallbacks`` (a model the server does not serve, then one it does) and
    ``with_retry`` answer as plain, their requests sent by the served engine."""
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables.history import RunnableWithMessageHistory

    model = chat_openai(recording_proxy.base_url)
    prompt = ChatPromptTemplate.from_messages([("system", "You are a helpful assistant."),
                                               MessagesPlaceholder("history"), ("human", "{input}")])
    sessions: dict[str, InMemoryChatMessageHistory] = {}
    chat = RunnableWithMessageHistory(prompt | model, lambda sid: sessions.setdefault(sid, InMemoryChatMessageHistory()),
                                      input_messages_key="input", history_messages_key="history")
    turns = ["Hi, I am Bob.", "What is my name?"]
    recording_proxy.take()
    plain = [chat.invoke({"input": t}, config={"configurable": {"session_id": "plain"}}).content for t in turns]
    sent_plain = recording_proxy.take()
    runs_before = len(served_runtime.timeline.query_ids())
    fast = TeolaRunnable(chat, runtime=served_runtime)
    teola = [fast.invoke({"input": t}, config={"configurable": {"session_id": "teola"}}).content for t in turns]
    assert teola == plain and all(plain)
    assert bodies(recording_proxy.take()) == bodies(sent_plain)  # the second turn's request holds the first
    history = {sid: [(m.type, m.content) for m in h.messages] for sid, h in sessions.items()}
    assert history["teola"] == history["plain"] and len(history["plain"]) == 4
    assert len(served_runtime.timeline.query_ids()) - runs_before >= len(turns)  # the called chain, lowered

    unserved = chat_openai(recording_proxy.base_url, model="not-served", max_retries=0)
    prompt = ChatPromptTemplate.from_template("Answer briefly: {q}")
    question = {"q": "Who won Super Bowl 50?"}
    # (chain, requests relayed, graph runs): the fallbacks' model calls are relayed (the
    # refused first one is sent too; ``relayed`` counts answers); the chain a retry wraps is
    # a called chain, lowered into a graph run of its own
    for chain, relays, lowered in ((prompt | unserved.with_fallbacks([model]) | StrOutputParser(), 1, 0),
                                   ((prompt | model | StrOutputParser()).with_retry(stop_after_attempt=2), 0, 1)):
        expected = chain.invoke(question)
        sent_plain = recording_proxy.take()
        before, runs_before = relayed(served_runtime), len(served_runtime.timeline.query_ids())
        assert TeolaRunnable(chain, runtime=served_runtime).invoke(question) == expected
        assert bodies(recording_proxy.take()) == bodies(sent_plain)
        assert relayed(served_runtime) - before == relays
        assert len(served_runtime.timeline.query_ids()) - runs_before == lowered  # a wrapper run as is has none


def test_a_sync_calls_max_concurrency_limits_a_parallels_branches_as_plain(recording_proxy, served_runtime):
    """``invoke(x, {"max_concurrency": 1})`` runs a ``RunnableParallel``'s branches one at a
    time in plain LangChain (its executor's size): such a call runs the parallel as it is, each
    branch it calls a graph run of its own, one after the other — not one graph run sending
    the branches' requests together. A chain with nothing side by side, and ``ainvoke``
    (plain does not limit a parallel there), keep the one graph run."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableParallel

    recording_proxy.replay = True
    model = chat_openai(recording_proxy.base_url, max_tokens=6)
    branches = {k: ChatPromptTemplate.from_template(f"{k} {{x}}") | model | StrOutputParser() for k in ("Say", "Name")}
    parallel, single = RunnableParallel(branches), branches["Say"]
    x, limited = {"x": "cat"}, {"max_concurrency": 1}
    for chain, as_is in ((parallel, True), (single, False)):
        expected = chain.invoke(x, limited)
        fast = TeolaRunnable(chain, runtime=served_runtime)
        assert fast._plan(x).side_by_side is as_is
        known = set(served_runtime.timeline.query_ids())
        assert fast.invoke(x, limited) == expected
        runs = [q for q in served_runtime.timeline.query_ids() if q not in known]
        assert len(runs) == (2 if as_is else 1)
        spans = [served_runtime.timeline.spans([q]) for q in runs]
        if as_is:  # the second branch's run starts after the first one's ended
            assert min(s.ready for s in spans[1]) >= max(s.end for s in spans[0])
    runs_before = len(served_runtime.timeline.query_ids())
    assert asyncio.run(TeolaRunnable(parallel, runtime=served_runtime).ainvoke(x, limited)) == parallel.invoke(x)
    assert len(served_runtime.timeline.query_ids()) - runs_before == 1


def test_a_batch_input_that_fails_stops_the_others_as_plain(model_server, recording_proxy, served_runtime):
    """``batch`` / ``abatch`` without ``return_exceptions``: plain batches a sequence step by step, so an
    input whose prompt lacks a variable raises before any model call and every input's run
    ends with that ``KeyError``. Teola's other inputs, graph runs already under way, are
    cancelled (their requests aborted) and their runs end with the same error; with
    ``return_exceptions`` every other input is answered."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda

    class RootRuns(BaseCallbackHandler):
        def __init__(self):
            self.ended: list[str] = []
            self.models: set = set()  # model runs started and not ended

        def on_chain_end(self, outputs, *, run_id, parent_run_id=None, **kwargs):
            if parent_run_id is None:
                self.ended.append("ok")

        def on_chain_error(self, error, *, run_id, parent_run_id=None, **kwargs):
            if parent_run_id is None:
                self.ended.append(type(error).__name__)

        def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs):
            self.models.add(run_id)

        def on_llm_end(self, response, *, run_id, **kwargs):
            self.models.discard(run_id)

        def on_llm_error(self, error, *, run_id, **kwargs):
            self.models.discard(run_id)

    chain = ChatPromptTemplate.from_template("Tell me a long story about {topic}.") \
        | chat_openai(recording_proxy.base_url, max_tokens=96) | StrOutputParser()
    inputs = [{"topic": "cats"}, {"subject": "dogs"}, {"topic": "owls"}, {"topic": "bees"}]
    fast = TeolaRunnable(chain, runtime=served_runtime)
    causes = []
    for runner in (chain, fast):
        for call in (runner.batch, lambda *a: asyncio.run(runner.abatch(*a))):
            runs = RootRuns()
            with pytest.raises(KeyError) as raised:
                call(inputs, {"callbacks": [runs]})
            assert runs.ended == ["KeyError"] * 4, runner
            causes.append((repr(raised.value.__cause__), raised.value.__suppress_context__))
    assert causes[2:] == causes[:2]  # the error as raised: its own cause kept
    assert_server_and_engines_idle(model_server, served_runtime)  # the cancelled inputs' requests aborted

    def refuse_dogs(x: dict) -> dict:
        if x["topic"] == "dogs":
            time.sleep(0.5)  # the other inputs' model calls are under way by now
            raise ValueError("no dogs") from LookupError("dogs are not served")  # (as LangChain's `from e`)
        return x

    # the others' model calls are stopped mid-way: their started runs end (with the error)
    refusing = RunnableLambda(refuse_dogs) | chain
    both = [{"topic": t} for t in ("cats", "dogs", "owls")]
    for call in (TeolaRunnable(refusing, runtime=served_runtime).batch,
                 lambda *a: asyncio.run(TeolaRunnable(refusing, runtime=served_runtime).abatch(*a))):
        runs = RootRuns()
        with pytest.raises(ValueError, match="no dogs") as raised:
            call(both, {"callbacks": [runs]})
        assert runs.models == set() and "ValueError" in runs.ended and "KeyError" not in runs.ended
        assert repr(raised.value.__cause__) == "LookupError('dogs are not served')"  # (from None dropped it)
    answered = fast.batch(inputs[:3], return_exceptions=True)
    assert isinstance(answered[1], KeyError) and all(isinstance(a, str) and a for a in answered[::2])


def test_picking_several_keys_is_lowered_into_plains_addable_dict(recording_proxy, served_runtime):
    """``.pick(["answer", "question"])`` (LangChain's RAG-with-sources pattern): lowered, the
    same ``AddableDict`` of the keys the input holds, as plain's ``_pick`` builds it, returned
    and reported (the pick's run ends with it)."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    class PickEnds(BaseCallbackHandler):
        def __init__(self):
            self.names, self.ends = {}, []

        def on_chain_start(self, serialized, inputs, *, run_id, name=None, **kwargs):
            self.names[run_id] = name

        def on_chain_end(self, outputs, *, run_id, **kwargs):
            if (self.names.get(run_id) or "").startswith("RunnablePick"):
                self.ends.append((type(outputs).__name__, dict(outputs)))

    recording_proxy.replay = True
    answer = ChatPromptTemplate.from_template("Answer briefly: {question}") | chat_openai(recording_proxy.base_url) \
        | StrOutputParser()
    with_answer = RunnablePassthrough.assign(answer=answer)
    x = {"question": "Who won Super Bowl 50?"}
    for keys in (["answer", "question"], ["answer", "missing"]):
        chain = with_answer.pick(keys)
        fast = TeolaRunnable(chain, runtime=served_runtime)
        assert fast._plan(x).trace.opaque == []
        plain_ends, teola_ends = PickEnds(), PickEnds()
        expected = chain.invoke(x, {"callbacks": [plain_ends]})
        got = fast.invoke(x, {"callbacks": [teola_ends]})
        assert got == expected and type(got) is type(expected) and list(got) == list(expected)
        assert teola_ends.ends == plain_ends.ends and plain_ends.ends[0][0] == "AddableDict"


def test_a_legacy_chain_wrapped_is_called_as_plain_with_its_requests_relayed(recording_proxy, served_runtime):
    """Existing apps call legacy chains (``langchain_classic``: ``LLMChain``,
    ``load_summarize_chain``) as ``chain(inputs)``, ``chain.run(...)``, ``chain.predict(...)``,
    ``await chain.arun(...)``: wrapped, each answers as plain (``chain(...)`` raised TypeError),
    its model calls sent by Teola's served engine."""
    from langchain_classic.chains import LLMChain
    from langchain_classic.chains.summarize import load_summarize_chain
    from langchain_core.documents import Document
    from langchain_core.prompts import PromptTemplate

    recording_proxy.replay = True
    model = chat_openai(recording_proxy.base_url)
    fact = LLMChain(llm=model, prompt=PromptTemplate.from_template("Tell me a fact about {topic}."))
    summarize = load_summarize_chain(model, chain_type="stuff")
    docs = [Document(page_content="The Eiffel Tower is in Paris. It was completed in 1889.")]
    calls = [
        (fact, lambda c: c({"topic": "cats"})),
        (fact, lambda c: c.predict(topic="owls")),
        (summarize, lambda c: c.run(docs)),
        (summarize, lambda c: c({"input_documents": docs}, return_only_outputs=True)),
        (fact, lambda c: asyncio.run(c.arun(topic="dogs"))),
    ]
    for chain, call in calls:
        expected = call(chain)
        sent_plain = recording_proxy.take()
        before = relayed(served_runtime)
        assert call(TeolaRunnable(chain, runtime=served_runtime)) == expected
        assert bodies(recording_proxy.take()) == bodies(sent_plain) and len(sent_plain) == 1
        assert relayed(served_runtime) - before == 1


def test_structured_output_in_code_run_as_is_is_relayed_and_parsed_as_plain(recording_proxy, served_runtime):
    """``ChatOpenAI.with_structured_output(Schema)`` (LangChain's structured-output guide)
    ends in the SDK's ``chat.completions.parse``. A function step's ``chain.invoke`` /
    ``ainvoke`` of it runs as the chain's own graph run (``called_chains``; the call lowered
    as in ``test_served_models``); its ``batch`` runs as it is, the request relayed. Either
    way: plain's body (the schema as vLLM's JSON-schema constraint: valid by construction)
    and the same parsed object."""
    from typing import Literal

    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda
    from pydantic import BaseModel, Field

    class Place(BaseModel):
        """Where something is."""

        city: Literal["Paris", "Rome", "Berlin"] = Field(description="the city")
        country: Literal["France", "Italy", "Germany"]

    chain = (ChatPromptTemplate.from_template("Where is the {landmark}?")
             | chat_openai(recording_proxy.base_url, max_tokens=40).with_structured_output(Place))

    async def alocate(question: dict) -> Place:
        return await chain.ainvoke(question)

    code = RunnableLambda(lambda question: chain.invoke(question), afunc=alocate)
    fast = TeolaRunnable(code, runtime=served_runtime)
    question = {"landmark": "Eiffel Tower"}
    recording_proxy.take()
    plain = code.invoke(question)
    sent_plain = recording_proxy.take()
    before, runs_before = relayed(served_runtime), len(served_runtime.timeline.query_ids())
    got = fast.invoke(question)
    assert type(got) is Place and got == plain
    assert bodies(recording_proxy.take()) == bodies(sent_plain) and "response_format" in sent_plain[0][1]
    assert asyncio.run(fast.ainvoke(question)) == asyncio.run(code.ainvoke(question))
    assert relayed(served_runtime) == before and len(served_runtime.timeline.query_ids()) - runs_before == 2
    recording_proxy.take()

    batched = TeolaRunnable(RunnableLambda(lambda question: chain.batch([question])[0]), runtime=served_runtime)
    assert batched.invoke(question) == plain
    assert bodies(recording_proxy.take()) == bodies(sent_plain)
    assert relayed(served_runtime) - before == 1


def test_a_refused_request_raises_plains_error_and_the_next_call_works(recording_proxy, served_runtime):
    from langchain_core.runnables import RunnableLambda

    model = chat_openai(recording_proxy.base_url)
    long_prompt = "word " * 3000  # past the server's 2048-token context: HTTP 400
    step = RunnableLambda(lambda q: model.invoke(q).content)
    fast = TeolaRunnable(step, runtime=served_runtime)
    with pytest.raises(openai.BadRequestError) as plain:
        step.invoke(long_prompt)
    before = relayed(served_runtime)
    with pytest.raises(type(plain.value)) as routed:
        fast.invoke(long_prompt)
    sdk_error = routed.value.__context__  # ChatOpenAI re-raises the SDK's error as its own
    assert "Teola: model server" in "".join(getattr(sdk_error, "__notes__", []))
    assert fast.invoke("Say hi.") == step.invoke("Say hi.")
    assert relayed(served_runtime) - before == 1  # the refusal is not counted; the answer is


def test_calls_outside_a_run_or_with_their_own_http_client_stay_the_clients(recording_proxy, served_runtime):
    from langchain_core.runnables import RunnableLambda

    before = relayed(served_runtime)
    plain_model = chat_openai(recording_proxy.base_url)
    assert plain_model.invoke("Say hi.").content  # no Teola run: its own client
    own_client = chat_openai(recording_proxy.base_url, http_client=httpx.Client())
    answer = TeolaRunnable(RunnableLambda(lambda q: own_client.invoke(q).content), runtime=served_runtime)
    assert answer.invoke("Say hi.") == plain_model.invoke("Say hi.").content
    assert relayed(served_runtime) == before


# ------------------------------------------------------------------------------ LlamaIndex
def openai_like(base_url: str, **kwargs):
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(model=SERVED_NAME, api_base=base_url, api_key="none", is_chat_model=True,
                      **{"temperature": 0.0, "max_tokens": 12, **kwargs})


def drafting_workflow(llm):
    from llama_index.core.llms import ChatMessage
    from llama_index.core.workflow import Context, Event, StartEvent, StopEvent, Workflow, step

    class Drafted(Event):
        draft: str

    class Draft(Workflow):
        @step
        async def draft(self, ctx: Context, ev: StartEvent) -> Drafted:
            drafted = Drafted(draft=(await llm.acomplete(f"One sentence about {ev.topic}:")).text)
            ctx.write_event_to_stream(drafted)
            return drafted

        @step
        async def shorten(self, ev: Drafted) -> StopEvent:
            ask = [ChatMessage(role="user", content=f"Shorten: {ev.draft}")]
            streamed = "".join([r.delta async for r in await llm.astream_chat(ask)])
            return StopEvent(result=(streamed, (await llm.achat(ask)).message.content))

    return Draft(timeout=120)


def test_a_workflows_llm_calls_go_through_the_executors_served_engine(recording_proxy, served_runtime):
    llm = openai_like(recording_proxy.base_url)
    plain = asyncio.run(workflow_run(drafting_workflow(llm)))
    plain_bodies = bodies(recording_proxy.take())
    Settings.executor = TeolaExecutor(runtime=served_runtime)
    before = relayed(served_runtime)
    assert asyncio.run(workflow_run(drafting_workflow(llm))) == plain
    assert relayed(served_runtime) - before == 3
    assert bodies(recording_proxy.take()) == plain_bodies
    # a direct sync stream of the app's LLM, under the executor: relayed too, the same deltas
    deltas = [r.delta for r in llm.stream_complete("Count: one, two,")]
    Settings.executor = None
    assert deltas == [r.delta for r in llm.stream_complete("Count: one, two,")] and len(deltas) > 2
    assert relayed(served_runtime) - before == 4


def test_a_function_agent_answers_as_plain_with_its_requests_relayed(recording_proxy, served_runtime):
    from llama_index.core.agent.workflow import AgentOutput, FunctionAgent
    from llama_index.core.tools import FunctionTool

    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    def agent():
        return FunctionAgent(tools=[FunctionTool.from_defaults(population)],
                             llm=openai_like(recording_proxy.base_url, max_tokens=16, is_function_calling_model=True),
                             system_prompt="Answer briefly.")

    async def ask() -> tuple:
        handler = agent().run(user_msg="What is the capital of France?")
        outputs = [e.response.content async for e in handler.stream_events() if isinstance(e, AgentOutput)]
        return str(await handler), outputs

    plain = asyncio.run(ask())
    plain_bodies = bodies(recording_proxy.take())
    Settings.executor = TeolaExecutor(runtime=served_runtime)
    before = relayed(served_runtime)
    assert asyncio.run(ask()) == plain
    assert relayed(served_runtime) - before == len(plain_bodies) >= 1
    sent = bodies(recording_proxy.take())
    assert sent == plain_bodies and '"tools"' in sent[0] and '"stream": true' in sent[0]


def test_a_steps_calls_are_scheduled_at_the_steps_place_in_its_run(recording_proxy, served_runtime):
    """Calls of one run share its arrival; an earlier step has more of the run left after it."""
    from llama_index.core.workflow import Event, StartEvent, StopEvent, Workflow, step

    from teola_plugin.served_calls import current_scope

    llm = openai_like(recording_proxy.base_url, max_tokens=4)
    seen = {}

    class Asked(Event):
        text: str

    class TwoCalls(Workflow):
        @step
        async def ask(self, ev: StartEvent) -> Asked:
            seen["ask"] = current_scope().priority
            return Asked(text=(await llm.acomplete("Hi")).text)

        @step
        async def reply(self, ev: Asked) -> StopEvent:
            seen["reply"] = current_scope().priority
            return StopEvent(result=(await llm.acomplete(f"Reply to: {ev.text}")).text)

    async def run() -> str:
        return await TwoCalls(timeout=60).run()

    Settings.executor = TeolaExecutor(runtime=served_runtime)
    before = relayed(served_runtime)
    asyncio.run(run())
    assert relayed(served_runtime) - before == 2
    ask, reply = seen["ask"], seen["reply"]
    assert ask.query_id == reply.query_id and ask.query_arrival_s == reply.query_arrival_s > 0
    assert ask.remaining_s > reply.remaining_s > 0


def forced_tool_agent(base_url: str):
    """A FunctionAgent whose model must call its tool every turn (``tool_choice="required"``:
    vLLM constrains the call, so it is valid by construction): it never answers by itself."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    def population(city: str) -> str:
        """How many people live in a city."""
        return f"{city}: 2.1 million"

    llm = openai_like(base_url, max_tokens=80, is_function_calling_model=True,
                      additional_kwargs={"tool_choice": "required"})  # room for the constrained JSON
    return FunctionAgent(tools=[FunctionTool.from_defaults(population)], llm=llm, system_prompt="Answer briefly.")


def test_an_agent_past_its_max_iterations_raises_plains_error_and_the_next_run_works(recording_proxy, served_runtime):
    from workflows.errors import WorkflowRuntimeError

    async def ask() -> str:
        return str(await forced_tool_agent(recording_proxy.base_url).run(
            user_msg="How many people live in Paris?", max_iterations=2))

    with pytest.raises(WorkflowRuntimeError, match="Max iterations of 2 reached"):
        asyncio.run(ask())
    plain_bodies = [body for _, body in recording_proxy.take()]
    Settings.executor = TeolaExecutor(runtime=served_runtime)
    before = relayed(served_runtime)
    with pytest.raises(WorkflowRuntimeError, match="Max iterations of 2 reached"):
        asyncio.run(ask())
    sent = [body for _, body in recording_proxy.take()]
    assert relayed(served_runtime) - before == len(sent) == len(plain_bodies) == 2  # two turns, each a tool call
    assert sent[0] == plain_bodies[0] and sent[0]["tool_choice"] == "required"  # later ones carry the server's ids
    # the next run on the same engines answers
    assert asyncio.run(workflow_run(drafting_workflow(openai_like(recording_proxy.base_url))))[0][0]


async def workflow_run(workflow, **start) -> tuple:
    handler = workflow.run(**{"topic": "rain", **start})
    events = [(type(e).__name__, getattr(e, "draft", None)) async for e in handler.stream_events()]
    return await handler, events


def test_a_step_that_raises_after_its_calls_raises_plains_error(recording_proxy, served_runtime):
    from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step

    llm = openai_like(recording_proxy.base_url, max_tokens=4)

    class Faulty(Workflow):
        @step
        async def ask(self, ev: StartEvent) -> StopEvent:
            await llm.acomplete("Hi")
            raise KeyError("the step's own bug")

    async def run() -> None:
        await Faulty(timeout=60).run()

    with pytest.raises(Exception) as plain:
        asyncio.run(run())
    Settings.executor = TeolaExecutor(runtime=served_runtime)
    before = relayed(served_runtime)
    with pytest.raises(type(plain.value), match="the step's own bug"):
        asyncio.run(run())
    assert relayed(served_runtime) - before == 1


def test_a_cancelled_workflow_run_stops_its_request_on_the_server_and_the_next_run_works(model_server,
                                                                                       served_runtime):
    from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step
    from workflows.errors import WorkflowCancelledByUser

    base_url = f"http://127.0.0.1:{model_server.port}/v1"
    # a reply that outlasts the test on any machine unless it is aborted
    llm = openai_like(base_url, max_tokens=1500, additional_kwargs={"extra_body": {"min_tokens": 1500}})

    class Long(Workflow):
        @step
        async def write(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=(await llm.acomplete("Count: 1, 2, 3,")).text)

    async def cancel_mid_generation() -> None:
        handler = Long(timeout=600).run()
        await generating_for(model_server, handler)
        await handler.cancel_run()
        with pytest.raises(WorkflowCancelledByUser):
            await handler

    assert server_requests_running(model_server) == 0
    Settings.executor = TeolaExecutor(runtime=served_runtime)
    asyncio.run(cancel_mid_generation())
    assert_server_and_engines_idle(model_server, served_runtime)
    assert asyncio.run(workflow_run(drafting_workflow(openai_like(base_url))))[0][0]


def embedder_batches(runtime: Runtime) -> int:
    return sum(s["batches_run"] for s in runtime.run_sync(runtime.engines("embedder").stats()))


def test_embeddings_of_code_run_as_is_are_computed_by_the_embedder_engine(runtime):
    """A LangGraph node's retriever and a LlamaIndex workflow step embed with the app's own
    sentence-transformers model; under Teola those calls go to the embedder engine (the same
    model files and settings): same documents, same vectors; a model the engine does not
    compute (a query instruction) keeps its own."""
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_huggingface import HuggingFaceEmbeddings
    from langgraph.graph import END, START, StateGraph
    from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin import datasets
    from teola_plugin.engines.embedder import default_model_path

    passages = [p.text for p in datasets.load_corpus("squad-xquad-en")[:16]]
    embeddings = HuggingFaceEmbeddings(model_name=str(default_model_path()),
                                       encode_kwargs={"normalize_embeddings": True})
    retriever = InMemoryVectorStore.from_texts(passages, embeddings).as_retriever(search_kwargs={"k": 2})

    class State(TypedDict):
        question: str
        context: list[str]

    builder = StateGraph(State)
    builder.add_node("retrieve", lambda state: {"context": [d.page_content for d in retriever.invoke(state["question"])]})
    builder.add_edge(START, "retrieve")
    builder.add_edge("retrieve", END)
    graph = builder.compile()
    question = {"question": "Which team won Super Bowl 50?", "context": []}
    plain = graph.invoke(question)
    runtime.run_sync(runtime.start_engines("embedder"))
    before = embedder_batches(runtime)
    assert TeolaRunnable(graph, runtime=runtime).invoke(question) == plain and len(plain["context"]) == 2
    assert embedder_batches(runtime) > before  # the node's query embedding ran on the engine

    model = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")

    class Embed(Workflow):
        @step
        async def embed(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=model.get_query_embedding(ev.text))

    async def run(text: str) -> list[float]:
        return await Embed().run(text=text)

    text = "Who won Super Bowl 50?"
    plain_vector = asyncio.run(run(text))
    Settings.executor = TeolaExecutor(runtime=runtime, start_engines=False)
    before = embedder_batches(runtime)
    teola_vector = asyncio.run(run(text))
    assert embedder_batches(runtime) == before + 1 and teola_vector == pytest.approx(plain_vector, abs=1e-5)
    instructed = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu", query_instruction="q: ")
    assert instructed.get_query_embedding(text) == pytest.approx(
        model.get_query_embedding("q: " + text), abs=1e-5)  # its own prompt, computed by its own model
    assert embedder_batches(runtime) == before + 2  # only the engine's model's call went to the engine
