"""LCEL chains called by code Teola runs as it is run as their own graphs: a LangGraph node's chain.

A LangGraph graph, an agent or a function step is user code, which ``TeolaRunnable`` runs as
it is. The LCEL chains that code calls are what Teola can lower: a node that is a
``RunnableParallel``, a node function calling ``chain.invoke(...)`` or
``await chain.ainvoke(...)``, an opaque step's function doing the same. Within such a run
(the served-call scope's ``lowers``: a :class:`Lowering`), ``RunnableSequence`` and
``RunnableParallel`` ``invoke`` / ``ainvoke`` run the chain as ``TeolaRunnable(chain)`` would —
traced once per chain and input layout with the run's optimizer settings, its engine work
scheduled with every other query's (a ``Send`` fan-out's branches batch on the engines) — with
the same output, exceptions and callback runs (the call's config, else the node's ambient one,
as plain's ``invoke`` takes it).

A node that is itself ``prompt | llm | parser`` is not a call: LangGraph flattens a
``RunnableSequence`` node into its own step sequence (``RunnableSeq``) with the node's state
writers, so its steps run one by one as LangGraph runs them (the model's request routed).
Its own ``invoke`` runs: a chain that puts nothing on an engine or cannot be traced, a call
with call-time keyword arguments, the chain the scope's owner itself runs as it is, and every
call outside a Teola run. ``stream`` / ``batch`` of a called chain run as they are (their
model-server calls routed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import Runnable, RunnableParallel, RunnableSequence

from ..served_calls import current_scope
from ..recent import Recent

if TYPE_CHECKING:
    from .runnable import TeolaRunnable

# Said under a run's opaque components by ``explain()``.
EXPLAIN_CALLED = ("  (the LCEL chains they call — a RunnableParallel node, a node function's chain.invoke / "
                  "ainvoke — run as their own optimized graphs when they put work on an engine)")


class CalledChains:
    """The wrappers that run the chains called in one ``TeolaRunnable``'s runs, with its
    settings; the last ``MAX_CHAINS`` chains kept (alive with their ids)."""

    MAX_CHAINS = 128

    def __init__(self, wrap: Callable[[Runnable], TeolaRunnable]) -> None:
        self._wrap = wrap
        self._wrappers: Recent[TeolaRunnable] = Recent(self.MAX_CHAINS)

    def wrapper(self, chain: Runnable) -> TeolaRunnable:
        return self._wrappers.get_or_make(id(chain), lambda: self._wrap(chain), keep=chain)


@dataclass(frozen=True)
class Lowering:
    """What a served-call scope lowers: chains called in it, through ``chains``' wrappers."""

    chains: CalledChains
    running: Runnable | None = None  # the chain the scope's owner runs as it is: its own call stays plain


def _wrapper_in_scope(chain: Runnable) -> TeolaRunnable | None:
    scope = current_scope()
    lowering = scope.lowers if scope is not None else None
    if not isinstance(lowering, Lowering) or chain is lowering.running:
        return None
    return lowering.chains.wrapper(chain)


def _lowered_invoke(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def invoke(self: Runnable, input: Any, config: Any = None, **kwargs: Any) -> Any:
        fast = None if kwargs else _wrapper_in_scope(self)
        plan = fast.graph_plan(input, config) if fast is not None else None
        if plan is None:
            return original(self, input, config, **kwargs)
        return fast.invoke_graph(plan, input, config)

    invoke.__teola_original__ = original  # type: ignore[attr-defined]
    return invoke


def _lowered_ainvoke(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def ainvoke(self: Runnable, input: Any, config: Any = None, **kwargs: Any) -> Any:
        fast = None if kwargs else _wrapper_in_scope(self)
        plan = await fast.agraph_plan(input, config) if fast is not None else None
        if plan is None:
            return await original(self, input, config, **kwargs)
        return await fast.ainvoke_graph(plan, input, config)

    ainvoke.__teola_original__ = original  # type: ignore[attr-defined]
    return ainvoke


_COMPOSITIONS = (RunnableSequence, RunnableParallel)  # what LCEL's | and {...} build


_WRAPS = {"invoke": _lowered_invoke, "ainvoke": _lowered_ainvoke}


def install() -> None:
    """Wrap the compositions' own ``invoke`` / ``ainvoke`` (idempotent; inert outside a
    lowering scope; a method a class no longer defines itself is left alone)."""
    for cls in _COMPOSITIONS:
        for name, wrap in _WRAPS.items():
            method = cls.__dict__.get(name)
            if method is not None and not hasattr(method, "__teola_original__"):
                setattr(cls, name, wrap(method))


def uninstall() -> None:
    for cls in _COMPOSITIONS:
        for name in _WRAPS:
            original = getattr(cls.__dict__.get(name), "__teola_original__", None)
            if original is not None:
                setattr(cls, name, original)
