"""When a model-server call made by framework code goes through Teola: the routing scope.

Code Teola runs as it is — an opaque LangChain step or a whole LangGraph graph under
``TeolaRunnable``, a LlamaIndex workflow, agent or chat engine under the executor — still
calls its models. When such a call goes to a model server through the ``openai`` SDK, the
request is sent by the runtime's served engine for that server (``openai_sdk.py``), so the
engine scheduler admits, orders and times it with every other request to that server; an
embedding the embedder engine computes alike goes to that engine (``embedding_calls.py``).

A scope is active while Teola runs framework code for a caller: a LangChain plan sets it
around its graph run (:func:`routing_served_calls`; context variables reach the graph's
tasks and framework threads), and an integration may register a fallback
(:func:`set_fallback`) — LlamaIndex's is the executor running now or ``Settings.executor``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..runtime.policies import Priority

T = TypeVar("T")


@dataclass(frozen=True)
class ServedCallScope:
    """The runtime whose served engines send the calls made in this scope."""

    runtime: Any  # teola_plugin.runtime.runtime.Runtime
    priority: Priority = field(default_factory=Priority)
    lowers: Any = None
    """What lowers the framework calls made in this scope a level above the request: LangChain's
    ``called_chains.Lowering`` (the LCEL chains a LangGraph node calls run as their own graphs);
    None: those calls run as they are, their requests routed."""
    waiting: set[concurrent.futures.Future[Any]] = field(default_factory=set, compare=False)
    """Requests that synchronous code in this scope waits for (a sync LangGraph node runs in a
    thread, which cancelling the run does not stop): cancelled when the scope's run ends early."""

    def run_sync(self, coro: Awaitable[T]) -> T:
        """``runtime.run_sync(coro)``, cancelled with the scope's run (:meth:`cancel_waiting`)."""
        future = self.runtime.submit(coro)
        self.waiting.add(future)
        try:
            return future.result()
        except BaseException:  # Ctrl-C, or the run's cancel: stop the request too
            future.cancel()
            raise
        finally:
            self.waiting.discard(future)

    def cancel_waiting(self) -> None:
        for future in list(self.waiting):
            future.cancel()


_SCOPE: contextvars.ContextVar[ServedCallScope | None] = contextvars.ContextVar("teola_served_calls", default=None)
_fallbacks: list[Callable[[], ServedCallScope | None]] = []


@contextlib.contextmanager
def routing_served_calls(runtime: Any, priority: Priority | None = None, lowers: Any = None
                         ) -> Iterator[ServedCallScope]:
    """Model-server calls made in this context (and the tasks and threads it starts) go
    through ``runtime``'s served engines (and the calls ``lowers`` knows are lowered)."""
    from . import embedding_calls

    embedding_calls.install()  # an embedding class imported since the integration loaded
    scope = ServedCallScope(runtime, priority or Priority(), lowers)
    token = _SCOPE.set(scope)
    try:
        yield scope
    except BaseException:  # the run ended early (cancelled, failed): what its threads still wait for stops
        scope.cancel_waiting()
        raise
    finally:
        _SCOPE.reset(token)


def set_fallback(provider: Callable[[], ServedCallScope | None]) -> None:
    """Add a scope provider consulted when no scope is set (idempotent per provider)."""
    if provider not in _fallbacks:
        _fallbacks.append(provider)


def current_scope() -> ServedCallScope | None:
    scope = _SCOPE.get()
    if scope is not None:
        return scope
    for provider in _fallbacks:
        scope = provider()
        if scope is not None:
            return scope
    return None


def routed_iterate(runtime: Any, items: Iterator[T], lowers: Any = None) -> Iterator[T]:
    """``items`` (a framework's own stream) stepped with its model-server calls routed; the
    scope lives in a context of its own, so the caller's code between items is not in it."""
    context = contextvars.copy_context()
    context.run(_SCOPE.set, ServedCallScope(runtime, lowers=lowers))
    try:
        while True:
            try:
                item = context.run(next, items)
            except StopIteration:
                return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            context.run(close)


async def routed_aiterate(runtime: Any, items: AsyncIterator[T], lowers: Any = None) -> AsyncIterator[T]:
    """:func:`routed_iterate` for an async stream: each step runs as a task in the scope's context."""
    context = contextvars.copy_context()
    context.run(_SCOPE.set, ServedCallScope(runtime, lowers=lowers))

    async def step() -> T:
        return await items.__anext__()

    try:
        while True:
            try:
                item = await asyncio.create_task(step(), context=context)
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await asyncio.create_task(aclose(), context=context)


def routed_run_stream(runtime: Any, run: Any, lowers: Any = None) -> Any:
    """A typed run stream (``stream_events`` / ``astream_events(version="v3")``, beta: LangGraph's
    ``GraphRunStream`` / ``AsyncGraphRunStream``) whose pump pulls the graph's own stream
    through :func:`routed_iterate` / :func:`routed_aiterate`, so its model-server calls are
    routed whichever projection drives it. A stream pumped another way (a chat model's
    ``ChatModelStream``) is returned as it is: its calls go to the server directly, as plain's."""
    if getattr(run, "_graph_iter", None) is not None:
        run._graph_iter = routed_iterate(runtime, run._graph_iter, lowers)
    elif getattr(run, "_graph_aiter", None) is not None:
        run._graph_aiter = routed_aiterate(runtime, run._graph_aiter, lowers)
    return run


# What ``explain()`` says under a list of components that run as they are (both frameworks).
EXPLAIN_ROUTED = ("  (their calls to a model server through the openai SDK — ChatOpenAI, OpenAI, OpenAILike... — "
                  "are sent by Teola's served engines, scheduled with the other requests to that server)")
