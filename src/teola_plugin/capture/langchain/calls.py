"""How a LangChain component that stays opaque is called: as the plain chain would call it.

A plain ``chain.invoke`` calls each step's ``invoke``; ``chain.ainvoke`` / ``astream`` /
``abatch`` call each step's ``ainvoke``, on the caller's event loop. It matters: a
``RunnableLambda`` over an async function has no sync path at all, one given both runs its
async function under ``ainvoke``, and async code may hold objects bound to the caller's
loop (a lock, an HTTP session). TeolaRunnable runs each graph inside :func:`calling_from`,
which records the caller's loop (``None`` for a sync call) in a context variable the
graph's tasks inherit; an opaque step then calls ``ainvoke`` on that loop, or ``invoke``
on a framework thread.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ...runtime.framework_threads import in_framework_thread

T = TypeVar("T")

_CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "teola_langchain_caller_loop", default=None)


async def calling_from(caller_loop: asyncio.AbstractEventLoop | None, work: Awaitable[T]) -> T:
    """Await ``work`` (a graph run) as part of a call of the chain from ``caller_loop``
    (``ainvoke`` / ``astream``), or from sync code (``None``: a sync call nested in an async
    one is sync again)."""
    token = _CALLER_LOOP.set(caller_loop)
    try:
        return await work
    finally:
        _CALLER_LOOP.reset(token)


async def as_the_chain_calls(sync_call: Callable[..., T], async_call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``async_call(*args)`` on the caller's loop under an async call of the chain, else
    ``sync_call(*args)`` on a framework thread."""
    caller = _CALLER_LOOP.get()
    if caller is None or caller.is_closed():
        return await in_framework_thread(sync_call, *args)
    if caller is asyncio.get_running_loop():
        return await async_call(*args)
    # On the caller's loop, as plain; cancelling this (the query's timeout) cancels it there.
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(async_call(*args), caller))
