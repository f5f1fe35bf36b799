"""What a LangChain value is while tracing: a symbolic stand-in for the run-time value.

Lowering rules pass these between each other instead of Python values, so a rule can
see *structure* the graph should keep: a dict whose keys are known (``Record``, what a
``RunnableParallel`` returns), a prompt whose rendering can be fused into the LLM call
that consumes it (``PendingPrompt``), a chat reply whose text streams (``ChatReply``).
Anything else is a ``Traced`` value: one output port of one primitive (or a graph input).
A consumer that needs a plain value asks the tracer to ``materialise`` it into a ``Ref``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from ...ir.node import Ref


class Kind(str, Enum):
    """What Python value a Traced ref holds, as far as tracing knows it."""

    ANY = "any"
    TEXT = "text"  # str
    DOCUMENTS = "documents"  # list[langchain Document]


@dataclass(frozen=True)
class Traced:
    """A value computed at run time: output ``ref`` of a primitive, or a graph input."""

    ref: Ref
    kind: Kind = Kind.ANY
    tokens_from: str | None = None  # the llm_decode whose streamed tokens are this text
    lines_of: str | None = None  # this is a LineListOutputParser's list of that llm_decode's text


@dataclass(frozen=True)
class Record:
    """A dict whose keys are known while tracing (insertion order kept). ``dict_type``: the
    type it is built as (the call's input may be LangChain's ``AddableDict``)."""

    fields: tuple[tuple[str, Value], ...]
    dict_type: type = dict

    @classmethod
    def of(cls, mapping: dict[str, Value], dict_type: type = dict) -> Record:
        return cls(tuple(mapping.items()), dict_type)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.fields)


@dataclass(frozen=True, eq=False)
class PendingPrompt:
    """A prompt template applied to ``variables``, not rendered yet: an LLM that consumes it
    renders it inside its own ``format`` primitive (template and conversion fused, so the
    prompt-splitting pass sees one format feeding one prefill)."""

    template: Any  # langchain BasePromptTemplate
    variables: Record
    origin: str
    run: int | None = None  # the template's run (run_scopes.py): ends when it is rendered


@dataclass(frozen=True)
class ChatReply:
    """An ``AIMessage`` whose content is ``text`` (built only where someone needs the message).
    ``message``: the model's own message at run time (a served model's, with its usage and
    ids), else the message is ``AIMessage(content=text)``."""

    text: Traced
    message: Ref | None = None


Value = Union[Traced, Record, PendingPrompt, ChatReply]
