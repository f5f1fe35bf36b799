"""TeolaRunnable calls what stays opaque as the plain chain calls it, and keeps LangChain's
API: ``ainvoke`` runs a step's async code (an async-only RunnableLambda works), ``batch``
leaves nested runnables' config alone, call-time kwargs reach the chain, the run is named
after the chain. Chains of user functions only: a real in-process runtime with no engines
(nothing to batch; the point is the calling convention)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from langchain_core.runnables import RunnableLambda
from langchain_core.tracers.context import collect_runs

from teola_plugin.langchain import TeolaRunnable
from teola_plugin.runtime.framework_threads import FRAMEWORK_THREADS
from teola_plugin.runtime.runtime import Runtime


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(engines={}, hosting="local")
    yield rt
    rt.shutdown()


async def _plus_ten(x: int) -> int:
    return x + 10


def test_an_async_only_step_runs_under_ainvoke_and_fails_under_invoke_as_plain(runtime):
    chain = RunnableLambda(lambda x: x + 1) | RunnableLambda(_plus_ten)
    fast = TeolaRunnable(chain, runtime=runtime)
    assert asyncio.run(fast.ainvoke(1)) == asyncio.run(chain.ainvoke(1)) == 12
    with pytest.raises(TypeError) as plain:
        chain.invoke(1)
    with pytest.raises(TypeError) as teola:
        fast.invoke(1)
    assert str(teola.value) == str(plain.value)

    async def stream() -> list[int]:
        return [c async for c in fast.astream(1)]

    assert asyncio.run(stream()) == [12]


def test_a_step_with_sync_and_async_code_runs_the_one_the_call_asks_for(runtime):
    async def which_async(x: str) -> str:
        return "async"

    chain = RunnableLambda(lambda x: x) | RunnableLambda(lambda x: "sync", afunc=which_async)
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast.invoke("q") == chain.invoke("q") == "sync"
    assert asyncio.run(fast.ainvoke("q")) == asyncio.run(chain.ainvoke("q")) == "async"
    assert asyncio.run(fast.abatch(["q", "r"])) == ["async", "async"]


def test_batch_keeps_every_input_and_leaves_nested_config_alone(runtime):
    def seen_cap(x: int, config) -> tuple[int, object]:
        return x, config.get("max_concurrency")

    def fail_on_seven(x: int) -> int:
        if x == 7:
            raise ValueError("seven")
        return x

    chain = RunnableLambda(fail_on_seven) | RunnableLambda(seen_cap)
    fast = TeolaRunnable(chain, runtime=runtime)
    inputs = list(range(100))
    out = fast.batch(inputs, return_exceptions=True)
    plain = chain.batch(inputs, return_exceptions=True)
    assert [type(o) for o in out] == [type(o) for o in plain]  # the failure at 7, in place
    assert [o for o in out if not isinstance(o, Exception)] == [o for o in plain if not isinstance(o, Exception)]
    assert all(cap is None for o in out if not isinstance(o, Exception) for _, cap in [o])
    assert fast.batch([1, 2], {"max_concurrency": 1}) == [(1, 1), (2, 1)]  # the caller's own cap: LangChain's


def test_call_time_kwargs_reach_the_chain_and_the_run_is_named_after_it(runtime):
    chain = RunnableLambda(lambda x, offset=0: x + offset) | RunnableLambda(lambda x: x * 2)
    fast = TeolaRunnable(chain, runtime=runtime)
    assert fast.invoke(1, offset=5) == chain.invoke(1, offset=5) == 12
    assert fast.get_name() == chain.get_name() == "RunnableSequence"
    with collect_runs() as runs:
        fast.invoke(1)
    assert [r.name for r in runs.traced_runs] == ["RunnableSequence"]  # the root run, as plain names it


def test_blocking_framework_code_runs_on_the_framework_threads_not_the_engines_pool(runtime):
    """The loop's default pool serves in-process engines; an opaque step waiting on one of
    them must not hold a thread of that pool (with enough in flight, nothing would move)."""
    chain = RunnableLambda(lambda x: x) | RunnableLambda(lambda x: threading.current_thread().name)
    graph_run = TeolaRunnable(chain, runtime=runtime, timeout_s=60)  # else nothing on an engine: runs as it is
    assert graph_run.invoke("q").startswith("teola-framework")


def test_async_steps_run_on_the_callers_loop(runtime):
    async def loop_of(x):
        return id(asyncio.get_running_loop())

    fast = TeolaRunnable(RunnableLambda(lambda x: x) | RunnableLambda(loop_of), runtime=runtime)

    async def call() -> tuple[int, int]:
        return id(asyncio.get_running_loop()), await fast.ainvoke(1)

    caller, step = asyncio.run(call())
    assert step == caller  # not the runtime's loop: async code may hold the caller's loop objects


def test_a_step_that_runs_another_teola_chain_cannot_starve_it_of_threads(runtime):
    """More outer calls than the framework pool has threads, each waiting for an inner chain
    whose own steps need a framework thread: the inner calls get threads of their own."""
    inner = TeolaRunnable(RunnableLambda(lambda x: x) | RunnableLambda(lambda x: x * 2), runtime=runtime)
    outer = TeolaRunnable(RunnableLambda(lambda x: x) | RunnableLambda(lambda x: inner.invoke(x) + 1),
                          runtime=runtime, timeout_s=120)
    n = FRAMEWORK_THREADS + 6
    assert outer.batch(list(range(n))) == [2 * x + 1 for x in range(n)]


def test_a_run_name_bound_with_config_names_the_run_as_plain(runtime):
    chain = (RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2)).with_config(
        run_name="my_chain", tags=["mine"])
    with collect_runs() as plain:
        assert chain.invoke(1) == 4
    with collect_runs() as teola:
        assert TeolaRunnable(chain, runtime=runtime).invoke(1) == 4
    (plain_run,), (teola_run,) = plain.traced_runs, teola.traced_runs
    assert teola_run.name == plain_run.name == "my_chain" and "mine" in teola_run.tags


def test_with_config_on_the_wrapper_replaces_a_configured_chains_config_as_plain(runtime):
    """``with_config`` of a chain that is itself configured replaces its tags, metadata and run
    name (a RunnableBinding's keys), on the wrapper as on the chain; of any other chain it adds
    a binding around it, as plain's."""
    configured = (RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2)).with_config(
        run_name="first", tags=["outer"], metadata={"user": "u1"})
    bare = RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2)
    for chain in (configured, bare):
        seen = []
        for target in (chain, TeolaRunnable(chain, runtime=runtime)):
            again = target.with_config(run_name="again", tags=["t2"], metadata={"user": "u2"})
            with collect_runs() as runs:
                assert again.invoke(1) == 4
            (run,) = runs.traced_runs
            seen.append((run.name, sorted(run.tags), run.extra["metadata"].get("user"),
                         [sorted(child.tags) for child in run.child_runs]))
        plain, teola = seen
        assert teola == plain and plain[:3] == ("again", ["t2"], "u2")


def test_a_langgraph_graphs_own_api_is_reachable_through_the_wrapper(runtime):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("inc", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    fast = TeolaRunnable(graph, runtime=runtime)
    config = {"configurable": {"thread_id": "t1"}}
    assert fast.invoke({"n": 1}, config) == {"n": 2}
    assert fast.get_state(config).values == {"n": 2} and len(list(fast.get_state_history(config))) == 3
    fast.update_state(config, {"n": 10})
    assert graph.get_state(config).values == {"n": 10} and fast.checkpointer is graph.checkpointer
    with pytest.raises(AttributeError):
        fast.no_such_attribute  # noqa: B018


def test_a_compiled_graphs_drawing_schemas_and_name_are_its_own(runtime):
    """What the LangGraph docs call on a compiled graph: ``get_graph(xray=True)`` (a subgraph
    drawn expanded), the JSON schemas LangGraph builds from its state and output schemas, the
    name given to ``compile``."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from typing_extensions import TypedDict

    class Out(TypedDict):
        count: int

    class S(MessagesState):
        count: int

    inner = StateGraph(S)
    inner.add_node("inner", lambda state: {"count": state["count"] + 1})
    inner.add_edge(START, "inner")
    outer = StateGraph(S, output_schema=Out)
    outer.add_node("child", inner.compile())
    outer.add_edge(START, "child")
    outer.add_edge("child", END)
    graph = outer.compile(name="MyApp")
    fast = TeolaRunnable(graph, runtime=runtime)
    assert fast.get_graph(xray=True).draw_mermaid() == graph.get_graph(xray=True).draw_mermaid()
    assert "child:inner" in fast.get_graph(xray=True).nodes
    assert fast.get_input_jsonschema() == graph.get_input_jsonschema()
    assert fast.get_output_jsonschema() == graph.get_output_jsonschema() and fast.get_output_jsonschema()["title"] == "Out"
    assert fast.get_config_jsonschema() == graph.get_config_jsonschema()
    assert fast.name == graph.name == "MyApp" == fast.get_name()


def test_a_graph_whose_state_pydantic_cannot_describe_still_explains(runtime):
    import typing

    from langgraph.graph import END, START, StateGraph

    class State(typing.TypedDict):  # pydantic refuses typing.TypedDict before Python 3.12
        n: int

    builder = StateGraph(State)
    builder.add_node("inc", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    graph = builder.compile()
    fast = TeolaRunnable(graph, runtime=runtime)
    assert "LangGraph" in fast.explain()
    assert set(fast.get_graph().nodes) == set(graph.get_graph().nodes) >= {"inc"}  # its own drawing
    assert fast.invoke({"n": 1}) == {"n": 2}
