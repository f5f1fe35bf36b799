"""The lower scheduling layer: one per engine instance, shared by every in-flight query.

Requests (one primitive each, from any query) wait in a priority queue per op. Whenever
an engine slot is free, the dispatcher takes the highest-priority requests of one op, up
to ``max_batch_size``, as one batch. That is work-conserving: an idle engine starts at
once, and while it is busy the requests of many queries pile up and leave together as the
next batch (where concurrent queries win). ``max_wait_s > 0`` optionally holds an idle
engine back for a fuller batch. No polling: the dispatcher sleeps on an event that
submissions, finished batches and the max-wait timer set.

Streams (LLM generation) are admitted through the same queue and slots, so the
priority rule orders them too, but each runs as its own request (vLLM batches them
continuously inside itself).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .policies import BatchPolicy, Priority
from .requests import BatchInfo, EngineRequest

Runner = Callable[[str, list[Any]], Awaitable[list[Any]]]
ADMIT = "__admit__"  # pseudo-op of stream admissions


class EngineScheduler:
    def __init__(self, name: str, run_batch: Runner, policy: BatchPolicy,
                 size_of: Callable[[str, Any], int] | None = None) -> None:
        self.name = name
        self.policy = policy
        self._run_batch = run_batch
        self._size_of = size_of or (lambda op, payload: 1)  # work items of one request
        self._queues: dict[str, list[EngineRequest]] = {}
        self._seq = itertools.count()
        self._batch_ids = itertools.count()
        self._running = 0
        self._wakeup: asyncio.Event | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.batches_run = 0

    # -- submission ----------------------------------------------------------------------
    async def submit(self, op: str, payload: Any, priority: Priority) -> tuple[Any, BatchInfo]:
        """Queue one request; returns its result and the batch it ran in."""
        future = self._enqueue(op, payload, priority)
        try:
            return await future
        except asyncio.CancelledError:
            self._forget(future)
            raise

    async def admit(self, priority: Priority) -> Callable[[], None]:
        """Wait for a slot for a stream; call the returned function when the stream ends."""
        future = self._enqueue(ADMIT, None, priority)
        try:
            release, _info = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                future.result()[0]()  # admitted just as we were cancelled: give the slot back
            else:
                self._forget(future)
            raise
        return release

    def _forget(self, future: asyncio.Future[Any]) -> None:
        """A cancelled request: its queue entry goes at the dispatcher's next turn (woken
        now, so an idle engine does not keep it), and a batch already running skips it."""
        future.cancel()
        if self._wakeup is not None:
            self._wakeup.set()

    def _enqueue(self, op: str, payload: Any, priority: Priority) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if self._dispatcher is None or self._dispatcher.done():
            self._wakeup = asyncio.Event()
            # A fresh context: the first request's (its query's callbacks, objects) must not
            # live on in a task that runs as long as the engine.
            self._dispatcher = loop.create_task(self._dispatch_loop(), name=f"engine-scheduler:{self.name}",
                                                context=contextvars.Context())
        request = EngineRequest(self.policy.key(priority, next(self._seq)), op, payload, priority,
                                loop.create_future(), enqueued=time.time())
        heapq.heappush(self._queues.setdefault(op, []), request)
        assert self._wakeup is not None
        self._wakeup.set()
        return request.future

    @property
    def queued(self) -> int:
        return sum(1 for q in self._queues.values() for r in q if not r.future.done())

    @property
    def queue_entries(self) -> int:
        """Entries held in the queues, cancelled ones not yet dropped included."""
        return sum(len(q) for q in self._queues.values())

    @property
    def running(self) -> int:
        """Engine slots taken: batches running and streams admitted."""
        return self._running

    # -- dispatch ------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            self._drop_cancelled()
            while self._running < self.policy.max_concurrent:
                batch = self._next_batch()
                if not batch:
                    break
                self._running += 1
                asyncio.get_running_loop().create_task(self._execute(batch))

    def _drop_cancelled(self) -> None:
        for op, queue in list(self._queues.items()):
            if any(r.future.done() for r in queue):
                queue[:] = [r for r in queue if not r.future.done()]
                heapq.heapify(queue)
            if not queue:
                del self._queues[op]

    def _next_batch(self) -> list[EngineRequest]:
        """The batch of the highest-priority op that may start now, or [] (timer armed)."""
        deadlines = []
        for _, op in sorted((q[0].key, op) for op, q in self._queues.items() if q):
            queue = self._queues[op]
            if op != ADMIT and self.policy.max_wait_s > 0 and len(queue) < self.policy.max_batch_size:
                deadline = min(r.enqueued for r in queue) + self.policy.max_wait_s
                if time.time() < deadline:  # let the batch fill a little longer
                    deadlines.append(deadline)
                    continue
            batch: list[EngineRequest] = []
            items = 0
            while queue:
                request = heapq.heappop(queue)
                if request.future.done():
                    continue
                n = 1 if op == ADMIT else self._size_of(op, request.payload)
                # a stream's admission is a batch of one; requests follow the policy's cut
                if batch and (op == ADMIT or not self.policy.admits(len(batch), items, n)):
                    heapq.heappush(queue, request)  # first in line for the next batch
                    break
                batch.append(request)
                items += n
            if not queue:
                del self._queues[op]
            if batch:
                return batch
        if deadlines:
            self._arm_timer(min(deadlines))
        return []

    def _arm_timer(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        self._timer = loop.call_later(max(0.0, deadline - time.time()), self._wakeup.set)

    async def _execute(self, batch: list[EngineRequest]) -> None:
        op = batch[0].op
        batch_id = next(self._batch_ids)
        start = time.time()
        try:
            if op == ADMIT:
                await self._run_admission(batch[0], batch_id, start)
                return
            try:
                results = await self._run_batch(op, [r.payload for r in batch])
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].future.done() or batch[0].future.set_exception(exc)
                    return
                # One bad request must not fail the other queries batched with it: rerun
                # each alone, so exactly the requests that fail on their own get the error.
                # (Engines validate a whole batch before writing, so a rerun is safe.)
                for r in batch:
                    await self._execute_alone(r, batch_id)
                return
            info = BatchInfo(self.name, batch_id, len(batch), start, time.time())
            for r, result in zip(batch, results):
                if not r.future.done():
                    r.future.set_result((result, info))
        finally:
            self.batches_run += 1
            if op != ADMIT:
                self._release_slot()

    async def _execute_alone(self, request: EngineRequest, batch_id: int) -> None:
        if request.future.done():
            return
        start = time.time()
        try:
            (result,) = await self._run_batch(request.op, [request.payload])
        except Exception as exc:
            request.future.done() or request.future.set_exception(exc)
        else:
            request.future.done() or request.future.set_result(
                (result, BatchInfo(self.name, batch_id, 1, start, time.time())))

    async def _run_admission(self, request: EngineRequest, batch_id: int, start: float) -> None:
        released = asyncio.Event()
        if request.future.done():  # cancelled while queued
            self._release_slot()
            return
        request.future.set_result((released.set, BatchInfo(self.name, batch_id, 1, start, start)))
        # The slot stays taken until the stream's owner releases it.
        asyncio.get_running_loop().create_task(self._hold_slot(released))

    async def _hold_slot(self, released: asyncio.Event) -> None:
        try:
            await released.wait()
        finally:
            self._release_slot()

    def _release_slot(self) -> None:
        self._running -= 1
        if self._wakeup is not None:
            self._wakeup.set()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            try:
                await self._dispatcher
            except asyncio.CancelledError:
                pass
        for queue in self._queues.values():
            for r in queue:
                if not r.future.done():
                    r.future.set_exception(RuntimeError(f"engine {self.name!r} was shut down"))
        self._queues.clear()
