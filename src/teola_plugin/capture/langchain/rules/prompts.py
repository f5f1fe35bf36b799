"""Prompt templates: rendered by the template's own code, inside a ``format`` primitive.

A template is not rendered where it appears: it becomes a ``PendingPrompt`` that the LLM
consuming it fuses into its own ``format`` (template + the model's input conversion, one
primitive), which is what prefill splitting looks for. For a completion model and an
f-string ``PromptTemplate`` the format also carries ``parts`` (the template's literal text
and variables), so the optimizer can see the prompt's static prefix.
"""

from __future__ import annotations

from string import Formatter
from typing import Any

from langchain_core.prompts import BasePromptTemplate, PromptTemplate

from ..tracer import NotLowerable, LangChainTracer, component_name, lowering
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
    optional = [v for v in getattr(template, "optional_variables", ()) if v in fields]
    return Record.of({v: fields[v] for v in [*required, *optional]})


@lowering(BasePromptTemplate)
def lower_template(t: LangChainTracer, template: BasePromptTemplate, value: Value) -> Value:
    return PendingPrompt(template, template_variables(template, value), component_name(template), t.current_run())


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
