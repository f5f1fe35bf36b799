"""LCEL composition: sequences, parallels / dict literals, passthrough, assign, pick, lambdas, parsers.

These emit no engine work; they route symbolic values (a dict literal stays a ``Record``
until something needs the dict itself), so the LLM and retrieval primitives they connect
see each other directly.
"""

from __future__ import annotations

import operator
from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import (RunnableGenerator, RunnableLambda, RunnableParallel, RunnablePassthrough,
                                      RunnableSequence)
from langchain_core.runnables.passthrough import RunnableAssign, RunnablePick
from langchain_core.runnables.utils import AddableDict

from ....ir.ops import Op
from ..step_runs import step_tag
from ..tracer import NotLowerable, LangChainTracer, langchains_own, lowering, unwrap_partial
from ..values import ChatReply, Kind, Record, Traced, Value
from .parsers import lower_parser


@lowering(RunnableSequence)
def lower_sequence(t: LangChainTracer, seq: RunnableSequence, value: Value) -> Value:
    for i, step in enumerate(seq.steps):
        value = t.lower(step, value, step_tag(i))  # its run carries seq:step:N (step_runs.py)
    return value


@lowering(RunnableParallel)
def lower_parallel(t: LangChainTracer, par: RunnableParallel, value: Value) -> Record:
    steps = list(par.steps__.items())
    outs = t.branches([lambda key=key, step=step: t.lower(step, value, f"map:key:{key}") for key, step in steps])
    return Record.of({key: out for (key, _), out in zip(steps, outs)})


@lowering(RunnablePassthrough)
def lower_passthrough(t: LangChainTracer, passthrough: RunnablePassthrough, value: Value) -> Value:
    if passthrough.func is not None or passthrough.afunc is not None:
        raise NotLowerable("RunnablePassthrough(func) calls a function for its side effects")
    return value


@lowering(RunnableAssign)
def lower_assign(t: LangChainTracer, assign: RunnableAssign, value: Value) -> Value:
    if not isinstance(value, Record):
        raise NotLowerable("input is not a dict with keys known while tracing")
    if not isinstance(assign.mapper, RunnableParallel):
        raise NotLowerable(f"its mapper is a {type(assign.mapper).__name__}, not a RunnableParallel")
    added = t.lower(assign.mapper, value)  # its own run, a child of the assign's (untagged, as plain)
    assert isinstance(added, Record)  # a RunnableParallel always lowers to one
    return Record.of({**value.as_dict(), **added.as_dict()})


def _itemgetter_key(func: Any) -> str | None:
    """The key of ``operator.itemgetter("key")`` (the common LCEL way to pick an input field)."""
    if isinstance(func, operator.itemgetter):
        _, args = func.__reduce__()
        if len(args) == 1 and isinstance(args[0], str):
            return args[0]
    return None


@lowering(RunnablePick)
def lower_pick(t: LangChainTracer, pick: RunnablePick, value: Value) -> Value:
    """``.pick("key")``: that field of a dict whose keys are known while tracing; ``.pick([...])``
    those of its keys it holds, as the ``AddableDict`` ``_pick`` builds (one holding none runs as it is)."""
    keys = [pick.keys] if isinstance(pick.keys, str) else list(pick.keys)
    if not isinstance(value, Record) or (isinstance(pick.keys, str) and pick.keys not in value.as_dict()):
        raise NotLowerable(f"input is not a dict known to hold {pick.keys!r} while tracing")
    fields = value.as_dict()
    if isinstance(pick.keys, str):
        return fields[pick.keys]
    picked = {k: fields[k] for k in keys if k in fields}
    if not picked:
        raise NotLowerable(f"input holds none of {keys} (it picks None)")
    return Record.of(picked, AddableDict)


def _function_name(func: Any) -> str:
    """``module.qualname`` of a step's function (a partial is named by the function it wraps)."""
    named = unwrap_partial(func)
    return f"{getattr(named, '__module__', None) or ''}.{getattr(named, '__qualname__', type(named).__name__)}"


@lowering(RunnableLambda)
def lower_lambda(t: LangChainTracer, lam: RunnableLambda, value: Value) -> Value:
    key = _itemgetter_key(getattr(lam, "func", None))
    if key is not None and isinstance(value, Record) and key in value.as_dict():
        return value.as_dict()[key]
    func = getattr(lam, "func", None) or getattr(lam, "afunc", None)
    function = _function_name(func)
    # whose function it is: LangChain's own glue (a helper's ``x["input"]``, a history read)
    # does no engine work and is not the user's code: run as it is, not reported as opaque
    if langchains_own(func):
        return t.opaque_call(lam, value, f"LangChain's own function ({function})", report=False)
    raise NotLowerable(f"user function ({function}): runs unchanged on the CPU")


@lowering(RunnableGenerator)
def lower_generator(t: LangChainTracer, gen: RunnableGenerator, value: Value) -> Value:
    """A generator step (``with_structured_output``'s refusal check): LangChain's own runs as it
    is, not reported as opaque; a user's is opaque (it may stream, count or log)."""
    func = getattr(gen, "_transform", None) or getattr(gen, "_atransform", None)
    function = _function_name(func)
    if langchains_own(func):
        return t.opaque_call(gen, value, f"LangChain's own generator ({function})", report=False)
    raise NotLowerable(f"user generator ({function}): runs unchanged on the CPU")


try:  # langchain-core >= 1.0: a message's ``.text`` (what the parser returns for a reply), also callable
    from langchain_core.messages.base import TextAccessor
except ImportError:  # older: a plain str
    TextAccessor = None


async def _as_message_text(text: str) -> str:
    return TextAccessor(text)


def _message_text(t: LangChainTracer, text: Traced) -> Traced:
    """What ``StrOutputParser`` returns for a reply: the message's ``.text``, a ``TextAccessor``
    (a str that is also callable, as ``.text()`` was), not the decoded str; its tokens are the
    decode's, as the text's were."""
    if TextAccessor is None:
        return text
    prim = t.add(Op.OPAQUE, name="message_text", inputs={"text": text.ref}, outputs=["out"], origin="StrOutputParser",
                 attrs={"fn": _as_message_text, "pure": True})
    return Traced(prim.out("out"), Kind.TEXT, tokens_from=text.tokens_from)


@lowering(StrOutputParser)
def lower_str_parser(t: LangChainTracer, parser: StrOutputParser, value: Value) -> Value:
    if type(parser) is not StrOutputParser:  # a subclass may parse (strip, cut) differently
        raise NotLowerable(f"{type(parser).__name__} subclasses StrOutputParser: its own parse runs")
    if isinstance(value, ChatReply):
        return _message_text(t, value.text)
    if isinstance(value, Traced) and value.kind is Kind.TEXT:
        return value  # the parser returns a str unchanged
    return lower_parser(t, parser, value)  # known at run time only: a step computing its invoke
