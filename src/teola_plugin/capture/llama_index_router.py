"""``RouterQueryEngine``: the selector picks engines -> each chosen engine's graph -> one answer.

    query -> select (an LLM selector's ``predict`` on its engine, parsed by its own output
             parser; any other selector's own ``select``)
          -> route: the chosen engine's traced graph; several chosen: all of them at once,
             then the router's summarizer over their answers (``combine_responses``' calls,
             expanded like any synthesizer's when its LLM is served by Teola)
          -> the Response, with ``metadata["selector_result"]`` as the router sets it

Fidelity: the engines are traced once here (``EngineGraphs``) and each chosen one answers
what its own ``query`` would; the selection, its log lines, ``verbose`` output, the
"Failed to select query engine" ``ValueError`` and the combined Response's sources are the
router's own code or a line-for-line copy of it. A multi-selection's engines run
concurrently (plain runs them one after another in ``query``, at once in ``aquery``).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.query_engine import router_query_engine
from llama_index.core.query_engine.router_query_engine import (RouterQueryEngine, acombine_responses,
                                                                 combine_responses)
from llama_index.core.schema import QueryBundle
from llama_index.core.selectors.llm_selectors import (
    LLMMultiSelector,
    LLMSingleSelector,
    _build_choices_text,
    _structured_output_to_selector_result,
)
from llama_index.core.utils import print_text

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from ..ir.expansion import Expansion
from .llama_index import (QUERY_ENGINE_RULES, LlamaIndexTracer, NotLowerable, component_call,
                          framework_passthrough, lowering_rule)
from .llama_index_models import llm_call_spec
from .llama_index_predict import PredictAndParse
from .llama_index_rules import synthesis_planner
from .llama_index_tools import EngineGraphs, run_all


@lowering_rule(QUERY_ENGINE_RULES, RouterQueryEngine)
def lower_router(tr: LlamaIndexTracer, router: RouterQueryEngine) -> dict[str, Ref]:
    origin = type(router).__name__
    engines = EngineGraphs(tr, dict(enumerate(router._query_engines)), "choice")
    try:
        summarizer = synthesis_planner(tr.ctx, router._summarizer, tr.traced.engines)
    except NotLowerable:
        summarizer = None  # combine_responses runs as it is
    if summarizer is not None and summarizer.streaming:
        summarizer = None  # its StreamingResponse is combine_responses' to build
    selection = _selection(tr, router, origin)
    response = tr.cpu_step("route", Route(router, engines, summarizer), {"query": tr.query, "selection": selection},
                           origin, pure=False)
    tr.note(response.node, router, "expands",
            "expands at run time into the chosen engine's graph (several chosen: all at once, then the "
            "summarizer's calls)")
    return {"response": response}


def _selection(tr: LlamaIndexTracer, router: RouterQueryEngine, origin: str) -> Ref:
    """The selector's result: an LLM selector's ``predict`` on its engine, parsed by its own
    output parser; any other selector's own ``select``."""
    selector, choices = router._selector, router._metadatas
    if type(selector) in (LLMSingleSelector, LLMMultiSelector):
        try:
            spec = llm_call_spec(tr.ctx.runtime, selector._llm, tr.traced.engines)
        except NotLowerable as exc:
            why = f"selection: {exc}"
        else:
            args = {"num_choices": len(choices), "context_list": _build_choices_text(choices)}
            if isinstance(selector, LLMMultiSelector):
                args["max_outputs"] = selector._max_outputs or len(choices)
            prompt = selector._prompt
            step = PredictAndParse(selector._llm, spec, prompt, lambda query: {**args, "query_str": query.query_str},
                                   lambda text: _structured_output_to_selector_result(prompt.output_parser.parse(text)),
                                   type(selector).__name__, tr.ctx.prepare_expansion, within=(selector, "_select"))
            ref = tr.cpu_step("select", step, {"query": tr.query}, origin, pure=False)
            tr.note(ref.node, selector, "expands", step.describe())
            return ref
    else:
        why = f"the selector {type(selector).__name__} runs its own select"
    return tr.opaque("select", selector, lambda query: selector.select(choices, query), {"query": tr.query}, why,
                     lambda query: selector.aselect(choices, query))


class Route:
    """(query, selector result) -> Expansion: the chosen engines' graphs and the combination."""

    def __init__(self, router: RouterQueryEngine, engines: EngineGraphs, summarizer: Any) -> None:
        self.router = router
        self.engines = engines
        self.summarizer = summarizer
        self.__qualname__ = "route[RouterQueryEngine]"

    def _chosen(self, ind: int, reason: str) -> None:
        log_str = f"Selecting query engine {ind}: {reason}."
        router_query_engine.logger.info(log_str)
        if self.router._verbose:
            print_text(log_str + "\n", color="pink")

    def __call__(self, query: QueryBundle, selection: Any) -> Expansion:
        with_result = lambda response: _with_selector_result(response, selection)  # noqa: E731
        if len(selection.inds) <= 1:
            try:
                ind = selection.ind
                self.router._query_engines[ind]
                self._chosen(ind, selection.reason)
            except ValueError as e:
                raise ValueError("Failed to select query engine") from e
            return self.engines.query(ind, query, then=with_result)
        for i, ind in enumerate(selection.inds):
            self._chosen(ind, selection.reasons[i])
            self.router._query_engines[ind]  # an index out of range: plain's IndexError, here
        return run_all("choice", [lambda ind=ind: self.engines.query(ind, query) for ind in selection.inds],
                       lambda responses: self.combine(responses, query, with_result), type(self.router).__name__,
                       finish_pure=False)

    def combine(self, responses: list[Any], query: QueryBundle, with_result: Any) -> Any:
        """``combine_responses``: the summarizer over the answers, their sources kept."""
        router_query_engine.logger.info("Combining responses from multiple query engines.")
        if self.summarizer is None:  # the router's own (a)combine_responses, as its query / aquery calls it
            summarizer = self.router._summarizer

            def combine() -> Any:
                with framework_passthrough():
                    return with_result(combine_responses(summarizer, responses, query))

            async def acombine() -> Any:
                with framework_passthrough():
                    return with_result(await acombine_responses(summarizer, responses, query))

            graph = PGraph("combine")
            combined = graph.add(Op.OPAQUE, name="combined", origin="RouterQueryEngine",
                                 attrs={"fn": component_call(self.router, combine, acombine), "pure": False})
            graph.output("out", combined.out())
            return Expansion(graph, {})
        source_nodes = [n for r in responses for n in r.source_nodes]
        graph = self.summarizer.answer_graph(query.query_str, [str(r) for r in responses]).copy()
        response = graph.add(Op.OPAQUE, name="combined", inputs={"text": graph.outputs["out"]},
                             origin="RouterQueryEngine",
                             attrs={"fn": lambda text: with_result(Response(response=text, source_nodes=source_nodes)),
                                    "pure": True})
        graph.output("out", response.out())
        return Expansion(graph, {})


def _with_selector_result(response: Any, selection: Any) -> Any:
    response.metadata = response.metadata or {}
    response.metadata["selector_result"] = selection
    return response
