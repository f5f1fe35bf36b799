"""Which LangChain callback run each part of a traced chain belongs to.

Plain LangChain reports a chain as a tree of runs: the chain's own run, a child run per
component it invokes (a sequence step tagged ``seq:step:N``, a parallel branch tagged
``map:key:K``), and the runs of what those invoke in turn. A lowered chain runs as one
graph, so the tracer records that tree while it lowers (one :class:`RunScope` per component
that has a run in plain), and a graph run reports it again (``langchain/run_tree.py``):

* a component whose primitives report their own run (a model call, a retriever, an opaque
  step's own ``invoke``: the rules that ask ``step_tag_of``) is reported by its own code; it
  only needs to run under the right parent run;
* a component lowered into routing or glue (a sequence, a parallel, ``assign``, a
  passthrough, ``StrOutputParser``, a prompt template fused into the model call that renders
  it, a composite retriever, ``RunnableEach`` / ``RunnableBranch``) has no code left that
  would report it as plain does: Teola reports its run, with its input and output, from the
  graph's values.

``with_config`` bindings have no run of their own: they name, tag and annotate the run of
what they bind, as in plain. The chain itself is the run ``TeolaRunnable`` opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .values import Value

RUN_KINDS = ("chain", "parser", "prompt", "retriever")


@dataclass(frozen=True)
class RunScope:
    """One component's run. ``parent`` None: a child of the chain's own run."""

    id: int
    name: str  # the run's name (a binding's run_name, else the component's name)
    parent: int | None
    tag: str | None  # the tag the run carries and its children do not (seq:step:N, map:key:K)
    kind: str  # how plain reports it: chain / parser / prompt runs, or a retriever run
    reported: bool  # Teola reports it (lowered glue); else the component's own code does
    input: Value | None = None
    output: Value | None = None
    after: int | None = None  # the sequence step before it: plain starts this run once that one ended
    bound: Mapping[str, Any] = field(default_factory=dict)  # run_name / tags / metadata of bindings


@dataclass
class RunScopes:
    """The run tree of one trace: the runs, and which run each primitive belongs to."""

    runs: dict[int, RunScope] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)  # primitive -> the run it is part of
    root_reports_itself: bool = False  # the chain's own run is reported by its primitives (a model, an opaque step)

    def reporter_of(self, run: int | None) -> int | None:
        """The nearest run Teola reports, at or above ``run`` (None: the chain's own): the
        run whose child config a primitive of ``run`` calls its component's code with."""
        while run is not None and not self.runs[run].reported:
            run = self.runs[run].parent
        return run

    def children(self, run: int) -> list[int]:
        return [r.id for r in self.runs.values() if r.parent == run]

    def __bool__(self) -> bool:
        return any(r.reported for r in self.runs.values())


def run_kind(component: Any) -> str:
    """How plain LangChain reports ``component``'s run."""
    from langchain_core.output_parsers import BaseOutputParser
    from langchain_core.prompts import BasePromptTemplate
    from langchain_core.retrievers import BaseRetriever

    if isinstance(component, BaseRetriever):
        return "retriever"
    if isinstance(component, BaseOutputParser):
        return "parser"
    if isinstance(component, BasePromptTemplate):
        return "prompt"
    return "chain"


@dataclass
class Frame:
    """A component being lowered (the tracer's stack)."""

    component: Any
    run: int | None  # its run's id; None: the chain's own run (or a binding's, lent to what it binds)
    parent: int | None
    tag: str | None
    bound: dict[str, Any]
    first_node: int  # how many nodes the graph had when lowering began
    transparent: bool = False  # a with_config binding: what it binds gets its tag and names
    reports_itself: bool = False  # a rule asked for its tag: its primitives report its run


class RunScopeBuilder:
    """Builds the :class:`RunScopes` of a trace while the tracer lowers (see the tracer's ``lower``)."""

    def __init__(self) -> None:
        self.scopes = RunScopes()
        self.frames: list[Frame] = []
        self._ids = 0
        self._last_step: dict[int | None, int] = {}  # parent run -> its latest sequence step's run

    # -- frames --------------------------------------------------------------------------------
    def enter(self, component: Any, tag: str | None, node_count: int) -> Frame:
        from langchain_core.runnables import RunnableBinding

        outer = self.frames[-1] if self.frames else None
        bound: dict[str, Any] = {}
        if outer is not None and outer.transparent and getattr(outer.component, "bound", None) is component:
            tag, bound = tag or outer.tag, dict(outer.bound)  # a binding lends its run to what it binds
        root = all(f.transparent for f in self.frames)
        parent = None if root else self.current_run()
        run = None
        if not root:
            self._ids += 1
            run = self._ids
        frame = Frame(component, run, parent, tag, bound, node_count)
        if isinstance(component, RunnableBinding):
            frame.transparent = True
            own = {k: component.config[k] for k in ("run_name", "tags", "metadata") if component.config.get(k)}
            frame.bound = _merged(own, bound)
        self.frames.append(frame)
        return frame

    def current_run(self) -> int | None:
        """The run that components lowered now are children of."""
        for frame in reversed(self.frames):
            if not frame.transparent:
                return frame.run
        return None

    def tag_of(self, component: Any) -> str | None:
        """The tag of ``component``'s run; its rule reports that run itself from now on."""
        for frame in reversed(self.frames):
            if frame.component is component:
                frame.reports_itself = True
                frame.transparent = False  # a binding whose rule reports the bound call: that run is its own
                return frame.tag
        return None

    def bound_of(self, component: Any) -> dict[str, Any]:
        for frame in reversed(self.frames):
            if frame.component is component:
                return dict(frame.bound)
        return {}

    def leave(self, frame: Frame, value: Value, input: Value, new_nodes: list[str]) -> None:
        """``frame``'s component lowered to ``value``; ``new_nodes``: what it emitted itself."""
        self.frames.pop()
        if frame.run is None:  # the chain itself (or a binding around it)
            self.scopes.root_reports_itself |= frame.reports_itself
            return
        reported = not (frame.reports_itself or frame.transparent)
        after = None
        if not frame.transparent and frame.tag is not None and frame.tag.startswith("seq:step:"):
            after = None if frame.tag == "seq:step:1" else self._last_step.get(frame.parent)
            self._last_step[frame.parent] = frame.run
        name = frame.bound.get("run_name") or _name(frame.component)
        self.scopes.runs[frame.run] = RunScope(frame.run, name, frame.parent, frame.tag, run_kind(frame.component),
                                               reported, input, value, after, frame.bound)
        for node in new_nodes:
            self.scopes.nodes.setdefault(node, frame.run)

    def abandon(self, frame: Frame) -> None:
        """``frame``'s rule declined (NotLowerable, nothing emitted): forget the runs its
        children recorded; the component then runs as one opaque step in the same frame."""
        dropped = {r for r in self.scopes.runs if frame.run is not None and r > frame.run}
        for r in dropped:
            del self.scopes.runs[r]
        self.scopes.nodes = {n: r for n, r in self.scopes.nodes.items() if r not in dropped}
        self._last_step = {p: r for p, r in self._last_step.items() if r not in dropped and p not in dropped}

    def attribute(self, node: str, run: int | None) -> None:
        """``node`` reports the run ``run`` (a prompt's format, emitted by the model that renders it)."""
        if run is not None:
            self.scopes.nodes[node] = run


def binding_config(runnable: Any) -> dict[str, Any]:
    """The run_name / tags / metadata the ``with_config`` bindings around ``runnable`` give its run."""
    from langchain_core.runnables import RunnableBinding

    layers = []
    while isinstance(runnable, RunnableBinding):
        layers.append({k: runnable.config[k] for k in ("run_name", "tags", "metadata") if runnable.config.get(k)})
        runnable = runnable.bound
    merged: dict[str, Any] = {}
    for own in layers:  # outermost first: each inner binding's own config under what is merged so far
        merged = _merged(own, merged)
    return merged


def under_binding(config: Mapping[str, Any], bound: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's ``config`` as a ``with_config`` binding (``bound``: its run_name / tags /
    metadata) passes it to what it binds; merged here, not by ``merge_configs``, which would
    read the context's callbacks in a second time."""
    return {**config, **_merged(bound, config)}


def _name(component: Any) -> str:
    get_name = getattr(component, "get_name", None)
    return get_name() if callable(get_name) else type(component).__name__


def _merged(own: Mapping[str, Any], outer: Mapping[str, Any]) -> dict[str, Any]:
    """A binding's config under the bindings around it, as nested ``RunnableBinding``s merge
    them (``merge_configs(self.config, caller's)``): tags add up (sorted, as it sorts them), and
    for run_name and metadata the outer binding's (nearer the caller) wins."""
    merged = dict(own)
    if outer.get("run_name"):
        merged["run_name"] = outer["run_name"]
    tags = set(own.get("tags") or []) | set(outer.get("tags") or [])
    if tags:
        merged["tags"] = sorted(tags)
    if outer.get("metadata"):
        merged["metadata"] = {**merged.get("metadata", {}), **outer["metadata"]}
    return merged
