"""One ``batch`` call's graph runs: when an input fails (no ``return_exceptions``), the rest stop.

Plain LangChain batches a sequence step by step: an input whose prompt fails to format
stops the batch before any model request is sent, and every input's run ends with that
error. Each input here is a graph run of its own, so the others may be further along: they
are cancelled (their engine work and model requests aborted), their runs end with the same
error, and ``batch`` raises it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Awaitable
from typing import Any

_GROUP: contextvars.ContextVar[BatchGroup | None] = contextvars.ContextVar("teola_batch_group", default=None)


class BatchGroup:
    """The graph runs of one ``batch`` (one per input, each on its own thread) or ``abatch``
    (one per input, each in its own task)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[concurrent.futures.Future[Any]] = set()
        self.failure: BaseException | None = None

    def join(self) -> None:
        """Make this thread's (this task's) graph runs members of the group."""
        _GROUP.set(self)

    def run(self, runtime: Any, coro: Awaitable[Any]) -> Any:
        """``runtime.run_sync(coro)`` as a member: cancelled when another input fails, then
        raising that input's error; its own error (not a cancellation) stops the others."""
        future = self._member(runtime.submit(coro))
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self.failure is not None:
                raise self.failure from None
            raise
        except BaseException as exc:
            future.cancel()  # a timeout or Ctrl-C on this thread stops its own run too
            self.fail(exc)
            raise
        finally:
            with self._lock:
                self._runs.discard(future)

    async def arun(self, runtime: Any, coro: Awaitable[Any]) -> Any:
        """``await runtime.run_async(coro)`` as a member (``abatch``: each input a task)."""
        await runtime.aevent_loop()
        future = self._member(runtime.submit(coro))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if self.failure is not None and future.cancelled():
                raise self.failure from None
            future.cancel()  # its caller cancelled it: its run stops too
            raise
        except BaseException as exc:
            self.fail(exc)
            raise
        finally:
            with self._lock:
                self._runs.discard(future)

    def _member(self, future: concurrent.futures.Future[Any]) -> concurrent.futures.Future[Any]:
        with self._lock:
            stopped = self.failure
            if stopped is None:
                self._runs.add(future)
        if stopped is not None:
            future.cancel()
            raise stopped
        return future

    def fail(self, exc: BaseException) -> None:
        """An input failed (in its graph run, or before it started one): stop the others."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = exc
            others = list(self._runs)
        for future in others:
            future.cancel()


def current() -> BatchGroup | None:
    return _GROUP.get()
