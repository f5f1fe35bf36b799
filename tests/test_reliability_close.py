"""Closing things leaves nothing running: a closed stream's engine request is aborted before
its slot is freed, even when its reader does not let go at once; closing a Ray handle
leaves none of its clean-up tasks pending.

The stream tests host a small fake streaming engine in-process (pure bookkeeping of
``EngineServer``: what is aborted and when the slot is freed); the handle test uses a real
Ray actor that Ray cannot place (it asks for a GPU), so its calls never answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from teola_plugin.engines.base import Engine
from teola_plugin.errors import EngineNotStartedError
from teola_plugin.runtime import hosting, ray_hosting
from teola_plugin.runtime.hosting import EngineServer, EngineSpec
from teola_plugin.runtime.policies import Priority


@dataclass
class Delta:
    n: int
    finished: bool = False


class Counter(Engine):
    """Streams 0, 1, 2, ... (up to 10,000) without awaiting between items; its abort (the
    ``finally`` of an unfinished stream) waits until the test lets it finish."""

    kind = "llm"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.aborted = 0
        self.abort_may_finish = asyncio.Event()
        self.abort_may_finish.set()

    async def _load(self) -> None:
        pass

    async def stream(self, slow_first: bool = False):
        finished = False
        try:
            for i in range(10_000):
                if i == 1 and slow_first:
                    await asyncio.sleep(3600)  # a decode step the cancellation lands in
                finished = i == 9_999
                yield Delta(i, finished)
        finally:
            if not finished:
                await self.abort_may_finish.wait()
                self.aborted += 1


def server() -> EngineServer:
    return EngineServer(EngineSpec("counter", f"{__name__}:Counter", kind="llm"), Counter())


async def _open(srv: EngineServer, **kwargs) -> str:
    opened = await srv.open_stream("stream", kwargs, Priority())
    assert not opened.finished and opened.first[0].n == 0
    return opened.sid


def test_a_closed_streams_slot_is_freed_only_once_its_request_is_aborted(monkeypatch):
    """The reader is cancelled inside a decode step and the engine's abort takes long (here:
    until the test says so). Before, close_stream gave up after its wait, freed the slot and
    forgot the stream while the request still ran; now the stream stays counted and the
    slot held until the abort has happened, and then both are freed."""
    monkeypatch.setattr(hosting, "READER_EXIT_WAIT_S", 0.2)

    async def scenario():
        srv = server()
        await srv.start()
        srv.engine.abort_may_finish.clear()
        sid = await _open(srv, slow_first=True)
        reader = asyncio.create_task(anext(srv.resume_stream(sid)))
        await asyncio.sleep(0.05)  # inside the slow step
        await srv.close_stream(sid)
        during = (srv.stats()["running"], srv.stats()["open_streams"], srv.engine.aborted)
        srv.engine.abort_may_finish.set()
        await asyncio.gather(reader, return_exceptions=True)
        await asyncio.sleep(0)
        after = (srv.stats()["running"], srv.stats()["open_streams"], srv.engine.aborted)
        return during, after

    during, after = asyncio.run(scenario())
    assert during == (1, 1, 0), "the slot was freed while the request was still being aborted"
    assert after == (0, 0, 1)


def test_a_reader_that_swallows_the_cancellation_stops_at_its_next_item_and_the_request_is_aborted(monkeypatch):
    """The cancellation lands outside the stream (where Ray's generator driver waits between
    items) and the reader goes on reading: it gets at most one more item, and the request is
    aborted and its slot freed (before: it read on for the whole wait, then the stream was
    closed under it)."""
    monkeypatch.setattr(hosting, "READER_EXIT_WAIT_S", 5.0)

    async def scenario():
        srv = server()
        await srv.start()
        sid = await _open(srv)
        got: list[int] = []

        async def stubborn_reader():
            async for delta in srv.resume_stream(sid):
                got.append(delta.n)
                try:
                    await asyncio.sleep(0.01)  # outside the stream
                except asyncio.CancelledError:
                    pass  # swallowed: it reads on

        reader = asyncio.create_task(stubborn_reader())
        await asyncio.sleep(0.1)
        read_before = len(got)
        await srv.close_stream(sid)
        read_after = len(got) - read_before
        await asyncio.wait_for(reader, 5)
        return read_after, srv.stats(), srv.engine.aborted

    read_after, stats, aborted = asyncio.run(scenario())
    assert read_after <= 1
    assert (stats["running"], stats["open_streams"], aborted) == (0, 0, 1)


@pytest.mark.slow
def test_closing_a_ray_handle_leaves_no_clean_up_task_pending(runtime, monkeypatch):
    """Calls to an actor that never answers (Ray cannot place it): one request in flight,
    one cancelled request and one cancelled stream opening (each leaves a clean-up task).
    After ``close()`` none of the handle's tasks may still be pending (they were destroyed
    pending when the loop stopped), and the in-flight caller gets an error, not a hang."""
    monkeypatch.setattr(ray_hosting, "CLOSE_WAIT_S", 0.5)
    spec = EngineSpec("unplaceable", "teola_plugin.engines.embedder:SentenceTransformerEmbedder",
                      kind="embedder", num_gpus=1)

    async def scenario():
        handle = ray_hosting.RayHandle(spec)  # `runtime` started Ray
        waiting = asyncio.create_task(handle.submit("embed", {"texts": ["a"]}, Priority()))
        cancelled = asyncio.create_task(handle.submit("embed", {"texts": ["b"]}, Priority()))
        opening = asyncio.create_task(handle.open_stream("stream", {"prompt": "c"}, Priority()))
        await asyncio.sleep(0.3)  # all sent
        cancelled.cancel()
        opening.cancel()
        await asyncio.gather(cancelled, opening, return_exceptions=True)
        await handle.close()
        pending = [t for t in asyncio.all_tasks()
                   if t is not asyncio.current_task() and t is not waiting and "RayHandle" in repr(t.get_coro())]
        (outcome,) = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 10)
        return pending, outcome

    pending, outcome = asyncio.run(scenario())
    assert pending == []
    assert isinstance(outcome, EngineNotStartedError) and "closed" in str(outcome)
