"""One ``llm.predict(prompt, **args)`` whose answer a component parses: a question
generator's sub-questions, a selector's choice.

At run time (the arguments hold the query) it expands into prompt -> llm_prefill ->
llm_decode (-> the LLM's own output parser), as ``llm_call`` builds every lowered
``predict``, then the component's own parsing of the text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from llama_index.core.schema import QueryBundle

from ..ir.graph import PGraph
from ..ir.ops import Op
from ..ir.expansion import Expansion
from .llama_index_spans import SpanPlan, span_in_building
from .llama_index_synthesis import llm_call
from .lowerable import LLMCallSpec


class PredictAndParse:
    """(query) -> Expansion whose output is ``parse(llm.predict(prompt, **args(query)))``."""

    def __init__(self, llm: Any, spec: LLMCallSpec, prompt: Any, args: Callable[[QueryBundle], dict[str, Any]],
                 parse: Callable[[str], Any], origin: str, prepare: Callable[[PGraph], PGraph],
                 within: tuple[Any, str] | None = None) -> None:
        self.llm = llm  # the component's LLM
        self.within = within  # (component, method): the span plain's call opens around the predict
        self.spec = spec  # how its calls run on an engine
        self.prompt = prompt
        self.args = args
        self.parse = parse
        self.origin = origin
        self.prepare = prepare
        self.__qualname__ = f"predict[{origin}]"

    def describe(self) -> str:
        return f"expands at run time into one prompt -> llm_prefill -> llm_decode chain on {self.spec.engine}"

    def __call__(self, query: QueryBundle) -> Expansion:
        graph = PGraph(f"{self.origin}_predict")
        plan = SpanPlan(graph)  # the spans of the component's method and of the predict, as plain's
        with plan.building(), (span_in_building(*self.within, args=lambda v: {"query_bundle": query})
                               if self.within else contextlib.nullcontext()) as within:
            text = llm_call(graph, self.llm, self.spec, self.prompt, self.args(query), self.origin)
            parsed = graph.add(Op.OPAQUE, name="parse", inputs={"text": text}, origin=self.origin,
                               attrs={"fn": self.parse, "pure": True})
        if within is not None:  # the component's method returns what it parsed
            within.result = parsed.out()
        graph.output("out", parsed.out())
        return plan.expansion(self.prepare(graph))
