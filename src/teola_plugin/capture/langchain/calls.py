"""How a LangChain component that stays opaque is called: as the plain chain would call it.

A plain ``chain.invoke`` calls each step's ``invoke``; ``chain.ainvoke`` / ``astream`` /
``abatch`` call each step's ``ainvoke``. It matters: a ``RunnableLambda`` over an async
function has no sync path at all, and one given both runs its async function under
``ainvoke``. TeolaRunnable's async entry points run the graph inside :func:`called_async`
(a context variable, which the graph's tasks inherit), and an opaque step calls the
matching method: the async one awaited on the runtime loop, the sync one on the framework
threads.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ...runtime.framework_threads import in_framework_thread

T = TypeVar("T")

_CALLED_ASYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("teola_langchain_called_async", default=False)


async def called_async(work: Awaitable[T]) -> T:
    """Await ``work`` as part of an async call (``ainvoke`` / ``astream``) of the chain."""
    token = _CALLED_ASYNC.set(True)
    try:
        return await work
    finally:
        _CALLED_ASYNC.reset(token)


async def as_the_chain_calls(sync_call: Callable[..., T], async_call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``async_call(*args)`` under an async call of the chain, else ``sync_call(*args)`` on a
    framework thread."""
    if _CALLED_ASYNC.get():
        return await async_call(*args)
    return await in_framework_thread(sync_call, *args)
