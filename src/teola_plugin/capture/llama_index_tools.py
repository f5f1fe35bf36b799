"""Query engines a composite engine picks at run time (a sub-question's tool, a router's
choice), traced once at trace time and run as expansions of the caller's graph; several
picked at once run together (:func:`run_all`).

Each engine's own trace (``LlamaIndexTracer.trace_nested``) is kept with its bound inputs;
its graph gets an ``out`` output (the Response) and is optimized once, on first use. Its
engines, notes and pending documents become the caller's trace's (``adopt``), so the
executor serves the stores and stores pending documents before the run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from llama_index.core.schema import QueryBundle

from ..ir.graph import PGraph
from ..ir.node import INPUT, Ref
from ..ir.ops import Op
from ..ir.expansion import Expansion
from .llama_index import LlamaIndexTracer, NotLowerable, TracedApp
from .llama_index_span_events import QueryEvents


class EngineGraphs:
    """The traced graphs of a composite engine's query engines, by key (tool name, index)."""

    def __init__(self, tr: LlamaIndexTracer, engines: Mapping[Hashable, Any], label: str) -> None:
        self.apps: dict[Hashable, TracedApp] = {key: tr.trace_nested(engine) for key, engine in engines.items()}
        for key, app in self.apps.items():
            if app.streaming_synthesis is not None:
                raise NotLowerable(f"{label} {key!r} streams its response (the engine runs its own code, "
                                   "its sub-queries still on Teola)")
        for key, app in self.apps.items():
            tr.adopt(app, f"{label} {key}")
        self.prepare = tr.ctx.prepare_expansion
        self._graphs: dict[Hashable, PGraph] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self.apps

    def graph(self, key: Hashable) -> PGraph:
        """The engine's graph with output ``out``: its Response (optimized once)."""
        if key not in self._graphs:
            graph = self.apps[key].graph.copy()
            graph.output("out", graph.outputs["response"])
            self._graphs[key] = self.prepare(graph)
        return self._graphs[key]

    def query(self, key: Hashable, query: QueryBundle, then: Callable[[Any], Any] | None = None,
              recover: tuple[type[Exception], Callable[[Exception], Mapping[str, Any]]] | None = None) -> Expansion:
        """``engine.query(query)`` as an expansion; ``then`` maps the Response (a pure step)."""
        graph = self.graph(key)
        response = graph.outputs["out"]
        if then is not None:
            graph = graph.copy()
            mapped = graph.add(Op.OPAQUE, name="then", inputs={"response": graph.outputs["out"]},
                               origin="query_engine", attrs={"fn": then, "pure": True})
            graph.output("out", mapped.out())
        app = self.apps[key]
        return Expansion(graph, app.inputs_for(query), recover=recover, observer=self._spans(app, graph, response))

    @staticmethod
    def _spans(app: TracedApp, graph: PGraph, response: Ref) -> Any:
        """The spans of the engine's ``query`` (its own ``query`` span, with its events) and of
        its lowered parts, as plain's ``engine.query(query)`` reports them."""
        if app.spans is None:
            return None
        engine, query = app.target, Ref(INPUT, "query")
        outer = app.spans.around(engine, "query", args=lambda v: {"str_or_query_bundle": v(query)},
                                 events=QueryEvents(query, engine), result=response)
        return app.spans.observer(graph, outer=outer)


def run_all(name: str, calls: Sequence[Callable[[], Any]], finish: Callable[[list[Any]], Any], origin: str, *,
            finish_pure: bool = True) -> Expansion:
    """``calls`` (each may return an Expansion: a sub-query) all at once, one graph level, then
    ``finish`` over their results in order; its result is the expansion's output."""
    graph = PGraph(name)
    results = {f"r{i}": graph.add(Op.OPAQUE, name=f"{name}_{i}", origin=origin,
                                  attrs={"fn": call, "pure": False}).out()
               for i, call in enumerate(calls)}
    done = graph.add(Op.OPAQUE, name=f"{name}_done", inputs=results, origin=origin,
                     attrs={"fn": lambda **r: finish([r[f"r{i}"] for i in range(len(calls))]), "pure": finish_pure})
    graph.output("out", done.out())
    return Expansion(graph, {})
