"""Streaming from the runtime's event loop into framework code.

LlamaIndex calls an LLM from plain threads (``complete``) or from the caller's own event
loop (``acomplete``); engines live on the runtime loop. These helpers move an async
iterator's items across, so neither loop blocks the other (single values go
through ``Runtime.run_sync`` / ``Runtime.run_async``).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from ..runtime.runtime import Runtime

T = TypeVar("T")
_DONE = object()


def iterate_sync(runtime: Runtime, make_stream: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """Items of ``make_stream()`` (run on the runtime loop) in the calling thread, as they come.
    Closing the iterator early cancels the producer (an LLM stream then aborts its request)."""
    items: queue.Queue[Any] = queue.Queue()

    async def produce() -> None:
        try:
            async for item in make_stream():
                items.put(item)
        except BaseException as exc:  # handed to the consumer, raised there
            items.put(_Failure(exc))
        finally:
            items.put(_DONE)

    future = runtime.submit(produce())
    try:
        while True:
            item = items.get()
            if item is _DONE:
                break
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        if not future.done():
            future.cancel()


async def iterate_async(runtime: Runtime, make_stream: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
    """Like :func:`iterate_sync` for a consumer on another event loop (or the runtime's own)."""
    consumer = asyncio.get_running_loop()
    runtime_loop = runtime._ensure_loop()
    if consumer is runtime_loop:
        async for item in make_stream():
            yield item
        return
    items: asyncio.Queue[Any] = asyncio.Queue()
    put = lambda item: consumer.call_soon_threadsafe(items.put_nowait, item)  # noqa: E731

    async def produce() -> None:
        try:
            async for item in make_stream():
                put(item)
        except BaseException as exc:
            put(_Failure(exc))
        finally:
            put(_DONE)

    future = runtime.submit(produce())
    try:
        while True:
            item = await items.get()
            if item is _DONE:
                break
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        if not future.done():
            future.cancel()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


__all__ = ["iterate_async", "iterate_sync"]
