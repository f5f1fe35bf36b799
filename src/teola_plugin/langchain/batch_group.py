"""One ``batch`` call's graph runs: when an input fails (no ``return_exceptions``), the rest stop.

Plain LangChain batches a sequence step by step: an input whose prompt fails to format
stops the batch before any model request is sent, and every input's run ends with that
error. Each input here is a graph run of its own, so the others may be further along: they
are cancelled (their engine work and model requests aborted), their runs end with the same
error (another input that fails ends with the first error too), and ``batch`` raises it. An
input that had already answered has ended its run (plain ends every run at the batch's end).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Iterator
from typing import Any

_GROUP: contextvars.ContextVar[BatchGroup | None] = contextvars.ContextVar("teola_batch_group", default=None)


class BatchGroup:
    """The graph runs of one ``batch`` (one per input, each on its own thread) or ``abatch``
    (one per input, each in its own task)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = set()
        self.failure: BaseException | None = None

    def run(self, runtime: Any, coro: Awaitable[Any]) -> Any:
        """``runtime.run_sync(coro)`` as a member: stopped when another input fails, then
        raising that input's error once the run has ended (its callback runs reported)."""
        future = runtime.submit(self._member(coro))
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self.failure is None:
                raise
            failure = self.failure
        except BaseException as exc:
            future.cancel()  # a timeout or Ctrl-C on this thread stops its own run too
            failure = self.stopped_by(exc)
        raise failure  # out of the handler: its own cause and context stay (LangChain's `from e`)

    async def arun(self, runtime: Any, coro: Awaitable[Any]) -> Any:
        """``await runtime.run_async(coro)`` as a member (``abatch``: each input a task)."""
        await runtime.aevent_loop()
        future = runtime.submit(self._member(coro))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if self.failure is None or not future.cancelled():
                future.cancel()  # its caller cancelled it: its run stops too
                raise
            failure = self.failure
        except BaseException as exc:
            failure = self.stopped_by(exc)
        raise failure  # as in run()

    async def _member(self, coro: Awaitable[Any]) -> Any:
        """``coro`` on the runtime loop as the group's: its task is what ``fail`` cancels, so
        the caller's future resolves only once the run has finished stopping."""
        entry = (asyncio.get_running_loop(), asyncio.current_task())
        with self._lock:
            stopped = self.failure
            if stopped is None:
                self._runs.add(entry)  # type: ignore[arg-type]
        if stopped is not None:
            coro.close()  # type: ignore[attr-defined]
            raise stopped
        try:
            return await coro
        finally:
            with self._lock:
                self._runs.discard(entry)  # type: ignore[arg-type]

    def stopped_by(self, exc: BaseException) -> BaseException:
        """What an input that failed with ``exc`` raises: the batch's first error (``exc`` if
        it is the first), so every input's run ends with that one, as in plain's batch."""
        if not isinstance(exc, Exception):  # Ctrl-C, SystemExit: its own
            return exc
        self.fail(exc)
        return self.failure or exc

    def fail(self, exc: BaseException) -> None:
        """An input failed (in its graph run, or before it started one): stop the others."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = exc
            others = list(self._runs)
        for loop, task in others:
            loop.call_soon_threadsafe(task.cancel)


def current() -> BatchGroup | None:
    return _GROUP.get()


@contextlib.contextmanager
def joined(group: BatchGroup | None) -> Iterator[BatchGroup | None]:
    """``group`` (None: no group) is this context's, and so of the threads and tasks it
    starts (LangChain's executor and asyncio copy the context into each)."""
    token = _GROUP.set(group)
    try:
        yield group
    finally:
        _GROUP.reset(token)


@contextlib.contextmanager
def stopping(group: BatchGroup | None) -> Iterator[None]:
    """An error before a member's graph run starts (its plan) stops the group too."""
    try:
        yield
        return
    except Exception as exc:
        if group is None:
            raise
        failure = group.stopped_by(exc)
        if failure is exc:
            raise  # as it was raised
    raise failure  # the batch's first error, out of the handler (its cause and context stay)
