"""Calling the runtime's event loop from framework code, streams included: the one bridge
both integrations (and the served-call routing) use.

Framework code calls Teola from plain threads (``invoke``, ``complete``) or from the
caller's own event loop (``ainvoke``, ``acomplete``); engines live on the runtime loop.
Single values go through ``Runtime.run_sync`` / ``Runtime.run_async``; streams through
:func:`iterate_sync` / :func:`iterate_async`, which move an async iterator's items across as
they come, so neither loop blocks the other. Closing the consumer early cancels the
producer (an LLM stream then aborts its engine request).

:func:`stream_sync` / :func:`stream_async` are the same for a producer that pushes items
and returns a result (a graph run pushing tokens): ``(False, item)`` per push, then
``(True, result)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from .hosting import ReplicaPool
from .policies import Priority
from .runtime import Runtime

T = TypeVar("T")
Push = Callable[[Any], None]
Producer = Callable[[Push], Awaitable[Any]]
_DONE = object()


async def started_pool(runtime: Runtime, name: str) -> ReplicaPool:
    """The pool serving engine ``name``, started on first use (or its in-process stand-in
    while its actors start; call on the runtime loop)."""
    await runtime.ready(name)
    return runtime.engines(name)


async def engine_stream(runtime: Runtime, engine: str, method: str, kwargs: Mapping[str, Any],
                        priority: Priority | None = None) -> AsyncIterator[Any]:
    """The items of ``engine.<method>(**kwargs)``, opened through the engine's scheduler
    (admission, priority) on the runtime loop; the stream is closed however this ends."""
    pool = await started_pool(runtime, engine)
    opened = await pool.open_stream(method, kwargs, priority or Priority())
    handed_over = opened.finished  # a finished stream is already closed
    try:
        for item in opened.first:
            yield item
        if not opened.finished:
            handed_over = True  # from here resume_stream closes it, even if abandoned
            async with contextlib.aclosing(pool.resume_stream(opened.sid)) as rest:
                async for item in rest:
                    yield item
    finally:
        if not handed_over:  # abandoned before the rest was read
            await pool.close_stream(opened.sid)


async def _pump(make_stream: Callable[[], AsyncIterator[Any]], put: Callable[[Any], None]) -> None:
    """``make_stream()``'s items into ``put`` (on the runtime loop), then its failure if any
    (raised at the consumer), then the end mark."""
    try:
        async for item in make_stream():
            put(item)
    except BaseException as exc:  # handed to the consumer, raised there
        put(_Failure(exc))
    finally:
        put(_DONE)


def iterate_sync(runtime: Runtime, make_stream: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """Items of ``make_stream()`` (run on the runtime loop) in the calling thread, as they come."""
    items: queue.SimpleQueue[Any] = queue.SimpleQueue()
    future = runtime.submit(_pump(make_stream, items.put))
    try:
        while (item := items.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        if not future.done():
            future.cancel()


async def iterate_async(runtime: Runtime, make_stream: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
    """Like :func:`iterate_sync` for a consumer on another event loop (or the runtime's own)."""
    consumer, loop = asyncio.get_running_loop(), await runtime.aevent_loop()
    if consumer is loop:
        async for item in make_stream():
            yield item
        return
    items: asyncio.Queue[Any] = asyncio.Queue()
    put = lambda item: consumer.call_soon_threadsafe(items.put_nowait, item)  # noqa: E731
    future = asyncio.run_coroutine_threadsafe(_pump(make_stream, put), loop)
    try:
        while (item := await items.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        if not future.done():
            future.cancel()


def _pushed(produce: Producer) -> Callable[[], AsyncIterator[tuple[bool, Any]]]:
    """A pushing producer as an async iterator of ``(False, item)``... ``(True, result)``."""
    async def items() -> AsyncIterator[tuple[bool, Any]]:
        pushed: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(produce(pushed.put_nowait))
        task.add_done_callback(lambda _: pushed.put_nowait(_DONE))  # after every push: FIFO
        try:
            while (item := await pushed.get()) is not _DONE:
                yield False, item
            yield True, task.result()
        finally:
            if not task.done():
                task.cancel()

    return items


def stream_sync(runtime: Runtime, produce: Producer) -> Iterator[tuple[bool, Any]]:
    return iterate_sync(runtime, _pushed(produce))


def stream_async(runtime: Runtime, produce: Producer) -> AsyncIterator[tuple[bool, Any]]:
    return iterate_async(runtime, _pushed(produce))


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
