"""The position of a call made from a LlamaIndex workflow step (``runtime/app_runs.py``).

A ``Workflow`` run (an agent's too: ``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow`` are
workflows) runs its steps as LlamaIndex runs them; the LLM, query engine and retriever calls a
step makes go through the executor. Such a call's priority comes from where its step stands:

- the run: LlamaIndex tags everything a run does with ``llamaindex.run_id`` (its
  instrumentation tags), so every call of one run shares the run's arrival;
- the step: the workflow runs it with its name in a context variable; the steps left to the
  answer are the fewest steps from it to a ``StopEvent`` over the workflow's own step graph
  (which events each step accepts and returns, as its ``@step`` signature declares them).
  A step none of whose events lead to a ``StopEvent`` is off the answer's path.

The step's name is read from the workflows package's context variables, which are not public
API: where they move, a call has no position and runs as a query of its own. The tests read
positions from real workflow runs, so such a move fails them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from ..recent import Recent
from ..runtime.app_runs import RunPosition, arrival_of

RUN_TAG = "llamaindex.run_id"
_paths: Recent[Mapping[str, int]] = Recent(256)  # steps to the answer, per workflow class and steps


def steps_to_answer(steps: Mapping[str, Any]) -> dict[str, int]:
    """For each step name (``Workflow._get_steps()``), the fewest steps from it to the answer,
    itself included (a step that returns a ``StopEvent`` is 1); steps off every path to a
    ``StopEvent`` are left out."""
    from workflows.events import StopEvent

    configs = {name: fn._step_config for name, fn in steps.items()}

    def feeds(producer: str, consumer: str) -> bool:
        returned = [t for t in configs[producer].return_types if isinstance(t, type)]
        return any(issubclass(r, a) for r in returned for a in configs[consumer].accepted_events
                   if isinstance(a, type))

    dist = {name: 1 for name, cfg in configs.items()
            if any(isinstance(t, type) and issubclass(t, StopEvent) for t in cfg.return_types)}
    frontier = deque(dist)
    while frontier:  # breadth first backwards from the answering steps
        consumer = frontier.popleft()
        for producer in configs:
            if producer not in dist and feeds(producer, consumer):
                dist[producer] = dist[consumer] + 1
                frontier.append(producer)
    return dist


def _running_step() -> tuple[Any, str] | None:
    """(workflow, step name) of the step running in this context, or None."""
    try:
        from workflows.runtime.types.results import InternalContextVar, StepWorkerStateContextVar

        step_name = StepWorkerStateContextVar.get().state.step_name
        context = InternalContextVar.get()()
        workflow = context._face._workflow
    except (ImportError, LookupError, AttributeError, TypeError):
        return None
    return workflow, step_name


def _run_id() -> str | None:
    try:
        from llama_index_instrumentation.dispatcher import active_instrument_tags
    except ImportError:
        return None
    return active_instrument_tags.get().get(RUN_TAG)


def position() -> RunPosition | None:
    """Where a call made now stands in its workflow run, or None outside a step."""
    step = _running_step()
    run_id = _run_id()
    if step is None or run_id is None:
        return None
    workflow, step_name = step
    steps = workflow._get_steps()
    key = (type(workflow), tuple(sorted(steps)))
    paths = _paths.get_or_make(key, lambda: steps_to_answer(steps))
    left = paths.get(step_name)
    return RunPosition(run_id, arrival_of(run_id), None if left is None else left - 1)
