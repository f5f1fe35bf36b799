"""Where an engine call stands in the app run that makes it: its priority on the engines.

The engine schedulers order requests by their latest start: the query's arrival plus its
critical path, minus the request's remaining path (``policies.py``). A lowered query knows
all three from its graph. A call made by framework code
Teola runs as it is — a step of a LlamaIndex workflow or agent run, the query engine or LLM
that step calls — would otherwise count as a query of its own, arrived now, with nothing left
after it. Its place in the *app run* says more:

- the run's arrival: under load an older run's critical calls go first, as for queries,
  so no run starves;
- the steps the run has left after the calling one to its final answer: a call on a long path
  to the answer goes before one near the end, and a call in a step off that path (one whose
  events never lead to the answer) yields to others (``OFF_PATH_SLACK_S``).

An integration registers a provider (:func:`add_provider`) that reads the position from its
framework's own context (LlamaIndex: ``llama_index/workflow_runs.py``), or marks a run of its
own with :func:`app_run` (a chat turn: its condense call, retrieval and answer share one
arrival; a LangChain call: the chains and models a LangGraph graph's nodes call share the
graph run's). The position is read in the caller's context: by the served-call scope's
priority, the plugin's model classes, and ``Runtime.execute`` (the runtime loop runs a
submitted coroutine in a copy of the submitting thread's context).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..recent import Recent
from .policies import Priority

MAX_RUNS = 4096  # arrival times remembered (runs seen last)
# A step whose events never lead to the answer: its calls may wait this long behind the
# critical work of runs that arrived after its own (bounded, so they do not starve)
OFF_PATH_SLACK_S = 30.0


@dataclass(frozen=True)
class RunPosition:
    """An engine call's place in its app run."""

    run_id: str
    arrival_s: float  # when the run was first seen (time.time())
    steps_after: int | None  # steps left after the calling one to the answer; None: off that path


_providers: list[Callable[[], RunPosition | None]] = []
_arrivals: Recent[float] = Recent(MAX_RUNS)
_MARKED: contextvars.ContextVar[RunPosition | None] = contextvars.ContextVar("teola_app_run", default=None)


def add_provider(provider: Callable[[], RunPosition | None]) -> None:
    """Register a reader of the app run a call is made in (idempotent per provider)."""
    if provider not in _providers:
        _providers.append(provider)


def arrival_of(run_id: str) -> float:
    """When the run ``run_id`` was first seen: the arrival of all its calls."""
    return _arrivals.get_or_make(run_id, time.time)


@contextlib.contextmanager
def app_run(kind: str) -> Iterator[RunPosition]:
    """The calls made in this context (and the tasks and threads it starts) are parts of one
    app run, arrived now, each on the path to its answer; inside a marked run, that run (a
    chain a LangGraph node calls is part of the graph's run)."""
    outer = _MARKED.get()
    if outer is not None:
        yield outer
        return
    run_id = f"{kind}-{uuid.uuid4().hex[:12]}"
    token = _MARKED.set(RunPosition(run_id, arrival_of(run_id), 0))
    try:
        yield _MARKED.get()  # type: ignore[misc]
    finally:
        _MARKED.reset(token)


def current() -> RunPosition | None:
    """The app run the caller is in, or None (a query of its own). A provider's reading (a
    workflow step's place) is the more precise one, so it comes first."""
    for provider in _providers:
        position = provider()
        if position is not None:
            return position
    return _MARKED.get()


def after_s(position: RunPosition | None) -> float:
    """Work (seconds) the run has left after the calling step; 0 off the answer's path."""
    if position is None or position.steps_after is None:
        return 0.0
    return position.steps_after * step_cost_s()


def slack_s(position: RunPosition | None) -> float:
    """How long the run's answer does not wait for the calling step: none on its path; off it,
    ``OFF_PATH_SLACK_S`` (its calls yield to the critical work of runs arriving that much later)."""
    return OFF_PATH_SLACK_S if position is not None and position.steps_after is None else 0.0


def call_priority() -> Priority:
    """A single engine call's priority (a relayed model-server request): its own step and
    what follows it, the run's arrival; a plain ``Priority()`` outside a run."""
    position = current()
    if position is None:
        return Priority()
    remaining = 0.0 if position.steps_after is None else step_cost_s() + after_s(position)
    return Priority(remaining, position.arrival_s, position.run_id, remaining + slack_s(position))


@functools.lru_cache(maxsize=1)
def step_cost_s() -> float:
    """What one app step's work costs by the default cost model: one LLM call of default
    size (its prefill and decode). The unit that turns steps left into seconds left."""
    try:
        from ..ir.ops import Op
        from ..optimizer.cost import DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, CostModel

        model = CostModel.default()
        return (model.latency("llm", Op.LLM_PREFILL, DEFAULT_PROMPT_TOKENS, "llm")
                + model.latency("llm", Op.LLM_DECODE, DEFAULT_MAX_TOKENS, "llm"))
    except ImportError:  # the optimizer is optional for running a graph
        return 1.0
