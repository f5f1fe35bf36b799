"""Output parsers (JSON, lists) as pure CPU primitives that call the parser's own ``parse``.

On a str or a chat reply, ``parser.invoke`` is ``parse_result([Generation(text)])``,
which for these exact classes is ``parse(text)``: so the primitive reads the decoded text
directly (no ``AIMessage`` is built) and returns what the parser returns, raising its own
``OutputParserException`` on bad output. When the caller's callbacks listen, it calls the
parser's own ``invoke`` on that text, so the parser's run is reported as plain reports it.
Subclasses may override ``parse_result`` and run unchanged; so do parsers whose input is not
known to be text.

The tool-call parsers (``JsonOutputToolsParser``, ``JsonOutputKeyToolsParser``,
``PydanticToolsParser``: what ``bind_tools`` chains and ``with_structured_output(...,
method="function_calling")`` end with) read the reply message's tool calls, so their step
calls the parser's own ``invoke`` on the model's own ``AIMessage``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.output_parsers import (BaseOutputParser, CommaSeparatedListOutputParser, JsonOutputParser,
                                           MarkdownListOutputParser, NumberedListOutputParser)
from langchain_core.output_parsers.openai_tools import (JsonOutputKeyToolsParser, JsonOutputToolsParser,
                                                        PydanticToolsParser)
from langchain_core.runnables.config import ensure_config

from ....ir.ops import Op
from ....runtime.framework_threads import in_framework_thread
from ..step_runs import step_config
from ..tracer import OUT, NotLowerable, LangChainTracer, component_name, lowering
from ..values import ChatReply, Kind, Traced, Value

LOWERED: set[type] = {JsonOutputParser, CommaSeparatedListOutputParser, NumberedListOutputParser,
                      MarkdownListOutputParser}
try:  # MultiQueryRetriever's "one query per line" parser, also used for sub-questions
    from langchain_classic.retrievers.multi_query import LineListOutputParser
    LOWERED.add(LineListOutputParser)
except ImportError:  # langchain-classic is optional
    LineListOutputParser = None


TOOL_CALL_PARSERS: set[type] = {JsonOutputToolsParser, JsonOutputKeyToolsParser, PydanticToolsParser}


@lowering(BaseOutputParser)
def lower_parser(t: LangChainTracer, parser: BaseOutputParser, value: Value) -> Value:
    if type(parser) in TOOL_CALL_PARSERS:
        return _lower_tool_call_parser(t, parser, value)
    if type(parser) not in LOWERED:
        raise NotLowerable(f"no lowering rule for {type(parser).__name__}")
    text = value.text if isinstance(value, ChatReply) else value
    if not (isinstance(text, Traced) and text.kind is Kind.TEXT):
        raise NotLowerable("input is not known to be a str or a chat reply")
    name = component_name(parser)
    inputs = {"text": text.ref}
    if isinstance(value, ChatReply):  # what plain's parser run is given: the reply message
        inputs["message"] = t.materialise(value)
    prim = t.add(Op.OPAQUE, name="parse", inputs=inputs, outputs=[OUT], origin=name,
                 attrs={"fn": _parse_step(t, parser, parser.parse), "pure": True})
    source = text.tokens_from  # the decode this text is, if any: a `.map()` after it may pipeline
    if type(parser) is LineListOutputParser and source in t.graph and t.graph[source].op is Op.LLM_DECODE:
        return Traced(prim.out(OUT), lines_of=source)
    return Traced(prim.out(OUT))


def _lower_tool_call_parser(t: LangChainTracer, parser: BaseOutputParser, value: Value) -> Value:
    """The parser's own ``invoke`` on the reply message (a pure CPU step)."""
    if not isinstance(value, ChatReply):
        raise NotLowerable("input is not known to be a chat model's reply")
    invoke, tag = parser.invoke, t.step_tag_of(parser)
    parse = _parse_step(t, parser, lambda message: invoke(message, step_config(tag)))
    prim = t.add(Op.OPAQUE, name="parse_tool_calls", inputs={"message": t.materialise(value)}, outputs=[OUT],
                 origin=component_name(parser), attrs={"fn": parse, "pure": True})
    return Traced(prim.out(OUT))


def _parse_step(t: LangChainTracer, parser: BaseOutputParser, direct: Any) -> Any:
    """The parse step's function: ``direct(value)`` when nobody listens; else the parser's own
    ``invoke`` reports its run (as plain's step does), off the runtime loop (handlers may block),
    given the reply message where there is one (plain's step is given the model's output)."""
    invoke, tag = parser.invoke, t.step_tag_of(parser)

    async def parse(**inputs: Any) -> Any:  # the text, or the reply message, or both
        value = inputs.get("text", inputs.get("message"))
        if not ensure_config().get("callbacks"):
            return direct(value)
        return await in_framework_thread(invoke, inputs.get("message", value), step_config(tag))

    return parse
