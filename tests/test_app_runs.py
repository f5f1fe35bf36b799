"""An engine call's place in its app run (runtime/app_runs.py, llama_index/workflow_runs.py).

Real LlamaIndex workflows run here (no model: the steps read their own position), so the
workflows package's context variables that ``workflow_runs`` reads are checked on every
upgrade; the priorities are pure arithmetic over them."""

from __future__ import annotations

import asyncio
import time

import pytest
from llama_index.core.workflow import Context, Event, StartEvent, StopEvent, Workflow, step

from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ops import Op
from teola_plugin.llama_index import workflow_runs
from teola_plugin.runtime import app_runs
from teola_plugin.runtime.graph_scheduler import GraphRun
from teola_plugin.runtime.policies import Priority


class Drafted(Event):
    pass


class Checked(Event):
    pass


class Logged(Event):
    pass


seen: dict[str, tuple[app_runs.RunPosition | None, Priority]] = {}


def record(step_name: str) -> None:
    seen[step_name] = (workflow_runs.position(), app_runs.call_priority())


class Review(Workflow):
    """draft -> check -> answer, with a logging step off the answer's path."""

    @step
    async def draft(self, ctx: Context, ev: StartEvent) -> Drafted | Logged:
        record("draft")
        ctx.send_event(Logged())
        return Drafted()

    @step
    async def check(self, ev: Drafted) -> Checked:
        await asyncio.to_thread(record, "check")  # a sync call a step makes in a thread
        return Checked()

    @step
    async def log(self, ev: Logged) -> None:
        record("log")

    @step
    async def answer(self, ev: Checked) -> StopEvent:
        record("answer")
        return StopEvent(result="done")


def test_steps_to_the_answer_follow_the_workflows_own_event_graph():
    app_runs.add_provider(workflow_runs.position)
    assert workflow_runs.steps_to_answer(Review(timeout=10)._get_steps()) == {"answer": 1, "check": 2, "draft": 3}

    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.llms import MockLLM

    agent = workflow_runs.steps_to_answer(FunctionAgent(tools=[], llm=MockLLM())._get_steps())
    # the agent loop: a tool call's results go back to the model, so calling a tool is farther
    assert agent["init_run"] > agent["run_agent_step"] > agent["parse_agent_output"] == 1
    assert agent["call_tool"] == agent["run_agent_step"]


def test_a_steps_calls_carry_the_runs_arrival_and_the_steps_left_to_its_answer():
    app_runs.add_provider(workflow_runs.position)
    seen.clear()
    async def run() -> str:
        return await Review(timeout=10).run()

    assert asyncio.run(run()) == "done"
    first = dict(seen)
    asyncio.run(run())

    positions = {name: position for name, (position, _) in first.items()}
    assert {p.run_id for p in positions.values()} == {positions["draft"].run_id}  # one run
    assert {p.arrival_s for p in positions.values()} == {positions["draft"].arrival_s}
    assert [positions[s].steps_after for s in ("draft", "check", "answer")] == [2, 1, 0]
    assert positions["log"].steps_after is None  # off the answer's path

    remaining = {name: priority.remaining_s for name, (_, priority) in first.items()}
    assert remaining["draft"] > remaining["check"] > remaining["answer"] > remaining["log"] == 0.0
    assert remaining["answer"] == pytest.approx(app_runs.step_cost_s())
    later = seen["draft"][0]
    assert later.run_id != positions["draft"].run_id and later.arrival_s > positions["draft"].arrival_s
    # outside a run: a query of its own
    alone = app_runs.call_priority()
    assert workflow_runs.position() is None and (alone.remaining_s, alone.query_id) == (0.0, "")
    assert alone.latest_start_s == alone.query_arrival_s == pytest.approx(time.time(), abs=5)
    # the log step's calls yield: their latest start is the run's arrival plus the off-path slack
    log = first["log"][1]
    assert log.latest_start_s == positions["log"].arrival_s + app_runs.OFF_PATH_SLACK_S
    assert first["answer"][1].latest_start_s == positions["answer"].arrival_s  # on the path


def test_a_marked_run_gives_its_calls_one_arrival_and_graph_runs_count_the_work_after_them():
    with app_runs.app_run("chat") as turn:
        assert app_runs.current() == turn and turn.steps_after == 0
        step = app_runs.step_cost_s()
        assert app_runs.call_priority() == Priority(step, turn.arrival_s, turn.run_id, step)
        with app_runs.app_run("langchain") as inner:  # a chain the run calls is part of it
            assert inner == turn
    assert app_runs.current() is None

    graph = PGraph("one")
    work = graph.add(Op.EMBED, "work", inputs={"texts": graph.input("texts")})
    graph.output("vectors", work.out())
    alone = GraphRun(graph, {"texts": []}, lambda name: None, cost=lambda prim: 0.5)
    inside = GraphRun(graph, {"texts": []}, lambda name: None, cost=lambda prim: 0.5, arrival=1.0, after_s=3.0)
    assert alone.remaining == {"work": 0.5} and inside.remaining == {"work": 3.5} and inside.arrival == 1.0
    assert (alone.critical_path_s, inside.critical_path_s) == (0.5, 3.5)
    off_path = GraphRun(graph, {"texts": []}, lambda name: None, cost=lambda prim: 0.5, arrival=1.0, slack_s=30.0)
    assert off_path.critical_path_s == 30.5  # its nodes' latest starts: 30 s after an on-path step's


def test_a_graph_expanded_at_run_time_keeps_its_querys_critical_path_and_the_work_after_its_node():
    graph = PGraph("two")
    first = graph.add(Op.EMBED, "first", inputs={"texts": graph.input("texts")})
    second = graph.add(Op.EMBED, "second", inputs={"texts": first.out()})
    graph.output("vectors", second.out())
    run = GraphRun(graph, {"texts": []}, lambda name: None, cost=lambda prim: 0.5, after_s=1.0)
    assert run.remaining == {"first": 2.0, "second": 1.5} and run.critical_path_s == 2.0
    # what "first" expands into runs with the work after "first" on every path, under the query's path
    assert run._after("first") == 1.5 and run._after("second") == 1.0
    child = GraphRun(graph, {"texts": []}, lambda name: None, cost=lambda prim: 0.5,
                     after_s=run._after("first"), critical_path_s=run.critical_path_s)
    assert child.remaining == {"first": 2.5, "second": 2.0} and child.critical_path_s == 2.0
