"""The runtime's event loop, running in a daemon thread of its own ("teola-loop").

Everything asynchronous the runtime does (graph runs, the engine schedulers of in-process
engines, Ray handles) lives on this one loop, so synchronous framework code
(``query_engine.query``) calls in from any thread with :meth:`LoopThread.run_sync`, and
code on another event loop with :meth:`LoopThread.run_async`; neither ever runs the
runtime's work on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    """One asyncio loop served forever by a daemon thread, started on demand."""

    def __init__(self, name: str = "teola-loop") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the thread and its loop (the caller serialises starts); returns the loop."""
        if self.loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self.thread = threading.Thread(target=serve, name=self.name, daemon=True)
            self.thread.start()
            ready.wait()
            self.loop = loop
        return self.loop

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run the blocking ``fn()`` on the loop's own thread (holding up the loop meanwhile),
        for work that must belong to a thread living as long as the loop."""
        return self.run_sync(_called(fn), timeout)

    def call_soon(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """:meth:`call` without waiting: the future of ``fn()``'s result."""
        return self.submit(_called(fn))

    def in_thread(self) -> bool:
        """Is the caller the loop's own thread (where blocking on the loop would hang)?"""
        return threading.current_thread() is self.thread

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the (started) loop from any thread."""
        assert self.loop is not None, "start() the loop first"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run_sync(self, coro: Awaitable[T], timeout: float | None) -> T:
        """Run ``coro`` on the loop from synchronous code; cancels it on timeout (or Ctrl-C)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:  # a timeout, Ctrl-C, or SystemExit (Ray's SIGTERM handler): stop the work too
            future.cancel()
            raise

    async def run_async(self, coro: Awaitable[T]) -> T:
        """Await ``coro`` on the (started) loop from another event loop (cancellation forwarded)."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        future = self.submit(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def stop(self, closing: Callable[[], Awaitable[None]], budget_s: float,
             on_error: Callable[[Exception], None]) -> None:
        """Run ``closing()`` on the loop (at most ``budget_s``), then stop the loop and join
        its thread."""
        loop, thread = self.loop, self.thread
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(closing(), loop).result(timeout=budget_s)  # type: ignore[arg-type]
        except Exception as exc:  # stopping anyway
            on_error(exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


async def _called(fn: Callable[[], T]) -> T:
    return fn()
