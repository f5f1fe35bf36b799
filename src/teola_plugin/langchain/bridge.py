"""Calling the Teola runtime (its own event loop thread) from LangChain's sync and async
code, including streams: a coroutine on the runtime loop pushes items through a queue that
the caller's generator drains, so tokens reach the caller as they are decoded.

``produce(push)`` is a coroutine function run on the runtime loop; ``push(item)`` may be
called from that loop any number of times; its return value is the final result. The
generators yield ``(False, item)`` for each pushed item and ``(True, result)`` last.
Closing a generator early cancels ``produce`` (an LLM stream being cancelled aborts its
engine request).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from ..runtime.hosting import ReplicaPool
from ..runtime.runtime import Runtime

Push = Callable[[Any], None]
Producer = Callable[[Push], Awaitable[Any]]
_END = object()


async def started_pool(runtime: Runtime, name: str) -> ReplicaPool:
    """The pool of engine ``name``, started on first use (call on the runtime loop)."""
    return (await runtime.start_engines(name))[name]


def stream_sync(runtime: Runtime, produce: Producer) -> Iterator[tuple[bool, Any]]:
    items: queue.SimpleQueue[Any] = queue.SimpleQueue()
    future = runtime.submit(produce(items.put))
    future.add_done_callback(lambda _: items.put(_END))  # after every push: same loop, FIFO
    try:
        while (item := items.get()) is not _END:
            yield False, item
        yield True, future.result()
    finally:
        if not future.done():
            future.cancel()


async def stream_async(runtime: Runtime, produce: Producer) -> AsyncIterator[tuple[bool, Any]]:
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[Any] = asyncio.Queue()

    def push(item: Any) -> None:  # called on the runtime loop, maybe another thread
        loop.call_soon_threadsafe(items.put_nowait, item)

    task = asyncio.ensure_future(runtime.run_async(produce(push)))
    task.add_done_callback(lambda _: items.put_nowait(_END))  # scheduled after the pushes
    try:
        while (item := await items.get()) is not _END:
            yield False, item
        yield True, task.result()
    finally:
        if not task.done():
            task.cancel()
