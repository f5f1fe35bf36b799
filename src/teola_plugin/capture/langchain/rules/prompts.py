"""Prompt templates: rendered by the template's own code, inside a ``format`` primitive.

A template is not rendered where it appears: it becomes a ``PendingPrompt`` that the LLM
consuming it fuses into its own ``format`` (template + the model's input conversion, one
primitive), which is what prefill splitting looks for. For a completion model and an
f-string ``PromptTemplate`` the format also carries ``parts`` (the template's literal text
and variables), so the optimizer can see the prompt's static prefix. Partial variables:
the caller's value for one wins; a function partial is called once per run
(:func:`evaluated_partials`).
"""

from __future__ import annotations

from string import Formatter
from typing import Any

from langchain_core.prompts import BasePromptTemplate, PromptTemplate

from ....ir.ops import Op
from ..tracer import OUT, NotLowerable, LangChainTracer, component_name, lowering
from ..values import Kind, PendingPrompt, Record, Traced, Value


def template_variables(template: BasePromptTemplate, value: Value) -> Record:
    """The variables the template reads, as a Record; NotLowerable when they are not all
    known while tracing (the template's own invoke then raises its own error, or copes)."""
    required = list(template.input_variables)
    if isinstance(value, Traced) and value.kind is Kind.TEXT and len(required) == 1:
        return Record.of({required[0]: value})  # a template with one variable takes a bare str
    if not isinstance(value, Record):
        raise NotLowerable("input is not a dict with keys known while tracing")
    fields = value.as_dict()
    missing = [v for v in required if v not in fields]
    if missing:
        raise NotLowerable(f"input lacks {missing}; the template reports that itself")
    # Optional variables, and partial ones the input gives (the caller's value wins over the
    # partial's, as the template's own merge of partial and user variables has it).
    given = [*getattr(template, "optional_variables", ()), *template.partial_variables]
    extra = [v for v in dict.fromkeys(given) if v in fields and v not in required]
    return Record.of({v: fields[v] for v in [*required, *extra]})


def evaluated_partials(t: LangChainTracer, template: BasePromptTemplate,
                       variables: Record) -> tuple[BasePromptTemplate, Record]:
    """A template's function partials (``.partial(date=today)``) called once per run. Plain's
    format calls each once and uses its value everywhere; Teola renders a prompt more than
    once (the request, the prompt run's output, the model's reported input), so each such
    function is a primitive called once per run, and its value a variable of a copy of the
    template without that partial (a caller's value for the key wins, as in plain)."""
    given = variables.as_dict()
    called = {k: fn for k, fn in template.partial_variables.items() if callable(fn) and k not in given}
    if not called:
        return template, variables
    for key, fn in called.items():
        async def call(fn: Any = fn) -> Any:
            return fn()

        prim = t.add(Op.OPAQUE, name=f"partial_{key}", inputs={}, outputs=[OUT], origin=component_name(template),
                     attrs={"fn": call, "pure": False})
        given[key] = Traced(prim.out(OUT))
    copy = template.model_copy(update={
        "partial_variables": {k: v for k, v in template.partial_variables.items() if k not in called},
        "input_variables": [*template.input_variables, *called]})
    return copy, Record.of(given)


@lowering(BasePromptTemplate)
def lower_template(t: LangChainTracer, template: BasePromptTemplate, value: Value) -> Value:
    rendered, variables = evaluated_partials(t, template, template_variables(template, value))
    return PendingPrompt(rendered, variables, component_name(template), t.current_run())


def literal_parts(template: Any, ports: set[str]) -> list[Any] | None:
    """``parts`` describing exactly what an f-string PromptTemplate renders (literal text and
    ``{"var": name}``), or None where that description would not be exact."""
    if (not isinstance(template, PromptTemplate) or template.template_format != "f-string"
            or template.partial_variables):
        return None
    parts: list[Any] = []
    for literal, name, spec, conversion in Formatter().parse(template.template):
        if literal:
            parts.append(literal)
        if name is None:
            continue
        if spec or conversion or name not in ports:
            return None
        parts.append({"var": name})
    return parts
