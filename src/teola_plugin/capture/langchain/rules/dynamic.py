"""Runnables whose work is decided at run time: ``RunnableEach`` (``.map()``) and ``RunnableBranch``
(and ``configurable_fields`` / ``configurable_alternatives``, which run as they are).

Both lower to one primitive that, when its input arrives, returns an ``Expansion``: the
graph scheduler runs that sub-graph inside the same query. The sub-graphs come from the
tracer's ``SubPlanner`` (traced and optimized once per runnable and input layout, cached).

* ``RunnableEach``: one independent sub-graph per element, all started at once, so the
  elements' LLM calls (and embeds, searches) share engine batches; the output is the list
  of the elements' outputs, in order, as ``bound.batch`` returns it.
  Decode pipelining: when the list is a ``LineListOutputParser``'s parse of an LLM's
  text (decomposition into sub-questions), each element starts as soon as its line is
  decoded: the decode streams its lines (``stream_items``) into a region node
  (``stream_from``) that expands one element per line. When the decode is done, the
  parser's own list is compared with the streamed lines; if they differ (whitespace the
  parser keeps), the elements run again on the parser's list, so the result is always
  what ``bound.batch(parser_output)`` returns.
* ``RunnableBranch``: the conditions run by their own code (in order, first truthy wins,
  as LangChain does, each run tagged ``condition:N``), then the chosen branch's lowered
  sub-graph runs (its run tagged ``branch:N`` / ``branch:default``).

Whether a sub-graph's calls stream as their models do is known only when it is traced, at
run time: a caller that streams (``stream``, ``astream_events``) runs a chain holding either
as it is (``streams_text`` off; its model-server requests still on the served engines), so it
streams plain's chunks and events; ``invoke`` / ``batch`` run the graph.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableBranch
from langchain_core.runnables.base import RunnableEachBase
from langchain_core.runnables.configurable import DynamicRunnable

from ....ir.graph import PGraph
from ....ir.node import Ref
from ....ir.ops import Op
from ....ir.expansion import Expansion
from ....runtime.caller import as_the_caller_calls
from ..step_runs import step_config
from ..tracer import OUT, LangChainTracer, NotLowerable, SubPlan, SubPlanner, component_name, lowering
from ..values import Traced, Value

RESULT = "output"  # the output of a sub-plan graph


@dataclass(frozen=True)
class Failed:
    """An element whose sub-graph raised, kept as its output (``expand_each(failures_as_values=True)``)."""

    error: Exception


def _failed(exc: Exception) -> dict[str, Any]:
    return {RESULT: Failed(exc)}


def _run_sub_plan(plan: SubPlan, failures_as_values: bool = False):
    async def run_element() -> Expansion:
        return Expansion(plan.graph, plan.inputs, observer=plan.observer,
                         recover=(Exception, _failed) if failures_as_values else None)

    return run_element


async def expand_each(planner: SubPlanner, bound: Any, elements: list[Any], origin: str, *,
                      failures_as_values: bool = False) -> Expansion:
    """One opaque node per element, each expanding into the element's own sub-graph (its
    own callback run, a child of the ``RunnableEach``'s, as ``bound.batch`` reports it); a
    ``list`` aggregate collects the outputs in element order. ``failures_as_values``: an
    element that raises gives a :class:`Failed` and the others run on (for a caller that
    raises the first failure in element order, as plain's loop or ``batch`` does)."""
    graph = PGraph(f"{origin}_each")
    plans = await asyncio.gather(*(planner.sub_plan(bound, x) for x in elements))
    outs = {}
    for i, plan in enumerate(plans):
        node = graph.add(Op.OPAQUE, name=f"element_{i}", outputs=[RESULT], origin=origin,
                         attrs={"fn": _run_sub_plan(plan, failures_as_values), "pure": True})
        outs[f"in{i}"] = node.out(RESULT)
    collect = graph.add(Op.AGGREGATE, name="elements", inputs=outs, attrs={"mode": "list"}, origin=origin)
    graph.output(OUT, collect.out())
    return Expansion(graph, {})


def _is_element_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


@lowering(RunnableEachBase)
def lower_each(t: LangChainTracer, each: RunnableEachBase, value: Value) -> Value:
    t.streams_text = False  # its elements' streams are known at run time only (above)
    if isinstance(value, Traced) and value.lines_of and _may_stream(t, value.lines_of):
        return _lower_pipelined_each(t, each, value)
    ref, planner, bound, origin = t.materialise(value), t.planner, each.bound, component_name(each)
    invoke, ainvoke = each.invoke, each.ainvoke

    async def run_each(input: Any) -> Any:
        if not _is_element_list(input):  # RunnableEach's own handling (and error) of the rest
            return await as_the_caller_calls(invoke, ainvoke, input)
        if not input:
            return []
        return await expand_each(planner, bound, list(input), origin)

    prim = t.add(Op.OPAQUE, name="each", inputs={"input": ref}, outputs=[OUT], origin=origin,
                 attrs={"fn": run_each, "expands": "one sub-graph per element, all started at once",
                        "expands_into": (bound,)})
    t.note_expands(each, prim)
    return Traced(prim.out(OUT))


def _may_stream(t: LangChainTracer, decode: str) -> bool:
    """The decode's lines are free to stream (no other parse, not streamed elsewhere)."""
    prim = t.graph[decode]
    return prim.attrs.get("parse") in (None, "lines") and not prim.attrs.get("stream_items")


def _lower_pipelined_each(t: LangChainTracer, each: RunnableEachBase, value: Traced) -> Value:
    planner, bound, origin = t.planner, each.bound, component_name(each)
    decode = value.lines_of
    t.graph.set_attrs(decode, parse="lines", stream_items=True)
    items = Ref(decode, "items")

    async def run_line(items: list[str]) -> Expansion:  # called once per decoded line
        return await expand_each(planner, bound, list(items), origin)

    # Not after the frontier: a region node waits for nothing but its item.
    per_line = t.graph.add(Op.OPAQUE, name=t.graph.unique_name("each_line"), inputs={"items": items},
                           outputs=[OUT], origin=origin,
                           attrs={"fn": run_line, "stream_from": decode, "item_outputs": (OUT,),
                                  "expands": "one sub-graph per line, each started as its line is decoded",
                                  "expands_into": (bound,)})
    t.note_expands(each, per_line)

    async def finish(answers: list[Any], items: list[str], elements: list[str]) -> Any:
        if list(elements) == list(items):
            return list(answers)
        if not elements:
            return []
        return await expand_each(planner, bound, list(elements), origin)  # the parser's own list

    prim = t.add(Op.OPAQUE, name="each", outputs=[OUT], origin=origin, attrs={"fn": finish},
                 inputs={"answers": per_line.out(OUT), "items": items, "elements": value.ref})
    return Traced(prim.out(OUT))


@lowering(RunnableBranch)
def lower_branch(t: LangChainTracer, branch: RunnableBranch, value: Value) -> Value:
    t.streams_text = False  # the chosen branch's stream is known at run time only (above)
    ref, planner, origin = t.materialise(value), t.planner, component_name(branch)
    cases, default = list(branch.branches), branch.default

    async def run_branch(input: Any) -> Expansion:
        chosen, tag = default, "branch:default"
        for i, (condition, runnable) in enumerate(cases):  # in order; a condition's own code decides
            if await as_the_caller_calls(condition.invoke, condition.ainvoke, input, step_config(f"condition:{i + 1}")):
                chosen, tag = runnable, f"branch:{i + 1}"
                break
        plan = await planner.sub_plan(chosen, input, tag)
        return Expansion(plan.graph, plan.inputs, token_nodes=frozenset({plan.tokens}) if plan.tokens else frozenset(),
                         observer=plan.observer)  # str deltas only

    prim = t.add(Op.OPAQUE, name="branch", inputs={"input": ref}, outputs=[RESULT], origin=origin,
                 attrs={"fn": run_branch, "expands": "the branch its conditions' own code chooses",
                        "expands_into": (*(runnable for _, runnable in cases), default)})
    t.note_expands(branch, prim)
    # The chosen branch's final decode streams when this node's output is what streams.
    return Traced(prim.out(RESULT), tokens_from=prim.name)


@lowering(DynamicRunnable)
def decline_configurable(t: LangChainTracer, runnable: DynamicRunnable, value: Value) -> Value:
    """``configurable_fields`` / ``configurable_alternatives``: what runs is chosen by each
    call's ``config["configurable"]``, which a plan kept per input layout does not see."""
    raise NotLowerable("configured per call (config['configurable']): runs as it is; its model-server "
                       "calls still go through Teola's served engines")
