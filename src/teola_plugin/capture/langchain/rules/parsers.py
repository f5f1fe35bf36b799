"""Output parsers as pure CPU primitives that compute what the parser's own ``invoke`` does.

``BaseOutputParser.invoke`` is ``parse_result([ChatGeneration(message)])`` on a message and
``parse_result([Generation(text)])`` on a str: the step makes that very call, so any parser
that keeps ``invoke`` (JSON, Pydantic, XML, list parsers, a user's subclass with its own
``parse_result``) returns what it returns in plain LangChain, refusal checks and
``OutputParserException`` included, without the run plain reports around it. When the
caller's callbacks listen, the step calls the parser's own ``invoke``, so that run is
reported as plain reports it. A parser that overrides ``invoke`` runs unchanged.

The tool-call parsers (``JsonOutputToolsParser``, ``JsonOutputKeyToolsParser``,
``PydanticToolsParser``: what ``bind_tools`` chains and ``with_structured_output(...,
method="function_calling")`` end with) read the reply message's tool calls, so their step
calls the parser's own ``invoke`` on the model's own ``AIMessage``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import BaseOutputParser
from langchain_core.output_parsers.openai_tools import (JsonOutputKeyToolsParser, JsonOutputToolsParser,
                                                        PydanticToolsParser)
from langchain_core.outputs import ChatGeneration, Generation
from langchain_core.runnables.config import ensure_config

from ....ir.ops import Op
from ....runtime.framework_threads import in_framework_thread
from ..step_runs import step_config
from ..tracer import OUT, NotLowerable, LangChainTracer, component_name, langchains_own, lowering
from ..values import ChatReply, Traced, Value

try:  # MultiQueryRetriever's "one query per line" parser, also used for sub-questions
    from langchain_classic.retrievers.multi_query import LineListOutputParser
except ImportError:  # langchain-classic is optional
    LineListOutputParser = None


TOOL_CALL_PARSERS: set[type] = {JsonOutputToolsParser, JsonOutputKeyToolsParser, PydanticToolsParser}


@lowering(BaseOutputParser)
def lower_parser(t: LangChainTracer, parser: BaseOutputParser, value: Value) -> Value:
    if type(parser) in TOOL_CALL_PARSERS:
        return _lower_tool_call_parser(t, parser, value)
    own = type(parser)
    if own.invoke is not BaseOutputParser.invoke or own.ainvoke is not BaseOutputParser.ainvoke:
        raise NotLowerable(f"{type(parser).__name__} overrides invoke: its own runs")
    # plain's parser run is given the reply message; a str or any other value as it is
    # (``invoke`` then decides at run time, as in plain)
    inputs = {"message": t.materialise(value)} if isinstance(value, ChatReply) else {"value": t.materialise(value)}
    # a library's parser is a pure function of its input; a user's own may count or log
    pure = langchains_own(own)
    prim = t.add(Op.OPAQUE, name="parse", inputs=inputs, outputs=[OUT], origin=component_name(parser),
                 attrs={"fn": _parse_step(t, parser, _plain_parse(parser)), "pure": pure})
    text = value.text if isinstance(value, ChatReply) else value
    source = text.tokens_from if isinstance(text, Traced) else None  # the decode this text is, if any
    if own is LineListOutputParser and source in t.graph and t.graph[source].op is Op.LLM_DECODE:
        return Traced(prim.out(OUT), lines_of=source)  # a `.map()` after it may pipeline
    return Traced(prim.out(OUT))


def _plain_parse(parser: BaseOutputParser) -> Any:
    """What ``BaseOutputParser.invoke`` computes, without the run it reports."""
    parse_result = parser.parse_result

    def parse(value: Any) -> Any:
        if isinstance(value, BaseMessage):
            return parse_result([ChatGeneration(message=value)])
        return parse_result([Generation(text=value)])

    return parse


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

    async def parse(**inputs: Any) -> Any:  # the reply message, or the value
        (value,) = inputs.values()
        if not ensure_config().get("callbacks"):
            return direct(value)
        return await in_framework_thread(invoke, value, step_config(tag))

    return parse
