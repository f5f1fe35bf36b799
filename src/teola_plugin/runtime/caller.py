"""Who called a graph run, and how its opaque steps call framework code: as plain would.

A plain sync call (``chain.invoke``, ``query_engine.query``) calls each component's sync
method; an async one (``ainvoke`` / ``astream`` / ``abatch``, ``aquery`` / ``aretrieve``) calls
the async methods, on the caller's event loop. It matters: a component may have no sync path
at all (a ``RunnableLambda`` over an async function, a retriever that only implements
``_aretrieve``), one given both runs its async code under an async call, and async code may
hold objects bound to the caller's loop (a lock, an HTTP session). Both integrations run each
graph inside :func:`calling_from`, which records the caller's loop (``None`` for a sync call)
in a context variable the graph's tasks inherit; an opaque step then awaits the async call on
that loop, or runs the sync call on a framework thread (:func:`as_the_caller_calls`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .framework_threads import in_framework_thread

T = TypeVar("T")

_CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "teola_caller_loop", default=None)


async def calling_from(caller_loop: asyncio.AbstractEventLoop | None, work: Awaitable[T]) -> T:
    """Await ``work`` (a graph run) as part of a call from ``caller_loop`` (an async entry
    point), or from sync code (``None``: a sync call nested in an async one is sync again)."""
    token = _CALLER_LOOP.set(caller_loop)
    try:
        return await work
    finally:
        _CALLER_LOOP.reset(token)


def caller_loop() -> asyncio.AbstractEventLoop | None:
    """The loop of the async call this graph run serves (None: a sync call). An engine that runs
    user code takes it in a request to run that code's async variant there (a LlamaIndex vector
    store's own ``aquery``)."""
    return _CALLER_LOOP.get()


async def as_the_caller_calls(sync_call: Callable[..., T], async_call: Callable[..., Awaitable[T]],
                              *args: Any, **kwargs: Any) -> T:
    """``async_call(...)`` on the caller's loop under an async call, else ``sync_call(...)``
    on a framework thread. The context (framework config, instrumentation) goes along."""
    caller = _CALLER_LOOP.get()
    if caller is None or caller.is_closed():
        return await in_framework_thread(sync_call, *args, **kwargs)
    return await on_loop(caller, async_call, *args, **kwargs)


async def on_loop(loop: asyncio.AbstractEventLoop, async_call: Callable[..., Awaitable[T]],
                  *args: Any, **kwargs: Any) -> T:
    """``async_call(...)`` awaited on ``loop`` (a caller's), from whichever loop runs this."""
    if loop is asyncio.get_running_loop():
        return await async_call(*args, **kwargs)
    # On the caller's loop, as plain (the handle carries this context there); cancelling
    # this (the query's timeout) cancels it there.
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(async_call(*args, **kwargs), loop))
