"""A direct channel to an engine actor on this node: its request calls over a Unix socket.

Through Ray every primitive pays an actor call: ~1.1 ms round trip on this machine's two
cores (``docs/benchmarks/scheduler.json``, ``ray_round_trip_ms``), where a frame over a local
Unix socket takes ~0.12 ms. So an engine actor also answers its request methods
(``REQUEST_CALLS``, ``REQUEST_STREAMS``) on a socket of its own, and a handle on the same node
sends them there; the rest (start, stats, close, restarts) stays on Ray, which still owns
the actor's life.

Closed by default: the socket lives in Linux's abstract namespace (no file to leak, not
reachable over a network), and a connection must open with the 32-byte secret the actor
hands out through a Ray call; nothing it sends is unpickled before that.

Frames are a header (call id, body length; 8 bytes each) and a pickle of a pair: ``(method,
args)`` to the actor; ``(kind, value)`` back, ``kind`` one of ``ok`` / ``err`` (a call's
answer), ``item`` / ``end`` / ``err`` (a stream's). A body that does not unpickle fails its
own call only. When the connection closes (the actor died or closed), every call still
waiting fails with Ray's ``ActorDiedError``, as the same call through Ray would, so retries
and restarts are Ray's.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import pickle
import secrets
import struct
import sys
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("teola_plugin")

REQUEST_CALLS = frozenset({"submit_many", "open_stream", "cancel", "close_stream"})
REQUEST_STREAMS = frozenset({"resume_stream"})
SECRET_BYTES = 32
HANDSHAKE_S = 5.0  # how long the actor waits for a new connection's secret
_HEADER = struct.Struct("!QQ")
ANSWER_KINDS = ("ok", "err", "item", "end")


def supported() -> bool:
    """Abstract Unix sockets are Linux's; elsewhere every call goes through Ray."""
    return sys.platform.startswith("linux")


@dataclass(frozen=True)
class ChannelAddress:
    """Where an actor's channel listens and what a connection must present."""

    socket: str  # abstract namespace name, leading NUL included
    secret: bytes
    node_id: str  # the Ray node the actor runs on: only a handle on that node may connect


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised in the actor, with its traceback there (for the caller's note)."""

    exc: BaseException
    traceback: str


def raised_remotely(exc: BaseException, remote_traceback: str) -> BaseException:
    """``exc`` as the caller sees it: its own type and message, the actor's traceback as a note."""
    exc.add_note(f"(raised inside a Ray engine actor){chr(10) + remote_traceback if remote_traceback else ''}")
    return exc


def _frame(call_id: int, kind: str, value: Any) -> bytes:
    from ray import cloudpickle  # exceptions and values of classes defined anywhere, as Ray pickles them

    try:
        body = cloudpickle.dumps((kind, value), protocol=5)
    except Exception as exc:  # an unpicklable answer: the caller still gets a clear error
        if kind not in ANSWER_KINDS:
            raise
        failure = RuntimeError(f"the engine's answer could not be sent back: {type(exc).__name__}: {exc}")
        body = cloudpickle.dumps(("err", RemoteFailure(failure, "")), protocol=5)
    return _HEADER.pack(call_id, len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, Any]:
    """The next frame's call id and its body, unpickled (or the exception unpickling raised)."""
    call_id, length = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    body = await reader.readexactly(length)
    try:
        return call_id, pickle.loads(body)
    except Exception as exc:
        return call_id, exc


def _failure(exc: BaseException) -> RemoteFailure:
    return RemoteFailure(exc, "".join(traceback.format_exception(exc)))


# ------------------------------------------------------------------------------ actor side
class ChannelServer:
    """Serves ``target``'s request methods (an engine actor's) to connections that know the secret."""

    def __init__(self, target: Any, node_id: str) -> None:
        self.target = target
        self.address = ChannelAddress(f"\0teola-engine-{uuid.uuid4().hex}", secrets.token_bytes(SECRET_BYTES),
                                      node_id)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> ChannelAddress:
        if self._server is None:
            self._server = await asyncio.start_unix_server(self._serve, self.address.socket)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._connections.add(me)
        calls: set[asyncio.Task[None]] = set()
        try:
            try:
                offered = await asyncio.wait_for(reader.readexactly(SECRET_BYTES), HANDSHAKE_S)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            if not hmac.compare_digest(offered, self.address.secret):
                log.warning("engine channel: a connection without the secret was refused")
                return
            while True:
                try:
                    call_id, body = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the handle closed (or its process died): nobody waits for answers
                task = asyncio.get_running_loop().create_task(self._answer(writer, call_id, body))
                calls.add(task)
                task.add_done_callback(calls.discard)
        finally:
            # Like a Ray caller that went away: what it asked for stops (a request leaves the
            # engine queue, a stream's reader closes the stream).
            for task in calls:
                task.cancel()
            writer.close()
            self._connections.discard(me)

    async def _answer(self, writer: asyncio.StreamWriter, call_id: int, body: Any) -> None:
        try:
            if isinstance(body, Exception):  # its arguments did not unpickle here
                raise body
            method, args = body
            if method in REQUEST_CALLS:
                writer.write(_frame(call_id, "ok", await getattr(self.target, method)(*args)))
            elif method in REQUEST_STREAMS:
                async for item in getattr(self.target, method)(*args):
                    writer.write(_frame(call_id, "item", item))
                    await writer.drain()
                writer.write(_frame(call_id, "end", None))
            else:
                raise ValueError(f"engine channel: {method!r} is not a request method")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            writer.write(_frame(call_id, "err", _failure(exc)))
        try:
            await writer.drain()
        except ConnectionError:
            pass


# ----------------------------------------------------------------------------- client side
class EngineChannel:
    """A handle's connection to one actor's :class:`ChannelServer` (use it from the loop that
    connected it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[str, Any]]] = {}
        self._closed = False
        self._reading = self.loop.create_task(self._read())

    @classmethod
    async def connect(cls, address: ChannelAddress, name: str) -> EngineChannel:
        reader, writer = await asyncio.open_unix_connection(address.socket)
        writer.write(address.secret)
        return cls(reader, writer, name)

    @property
    def closed(self) -> bool:
        return self._closed

    async def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the actor; its exception raised here as itself."""
        call_id = next(self._ids)
        answer = self.loop.create_future()
        self._calls[call_id] = answer
        try:
            await self._send(call_id, method, args)
            return await answer
        finally:
            self._calls.pop(call_id, None)

    async def stream(self, method: str, *args: Any) -> AsyncIterator[Any]:
        """The items of the actor's async generator ``method(*args)``, as they come."""
        call_id = next(self._ids)
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._streams[call_id] = items
        try:
            await self._send(call_id, method, args)
            while True:
                kind, value = await items.get()
                if kind == "end":
                    return
                if kind == "err":
                    raise value
                yield value
        finally:  # later items of an abandoned stream are dropped (the engine's close ends it)
            self._streams.pop(call_id, None)

    async def close(self) -> None:
        if not self._closed:
            self._writer.close()
        self._reading.cancel()
        await asyncio.wait({self._reading}, timeout=5)

    async def _send(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        if self._closed:
            raise self._lost()
        self._writer.write(_frame(call_id, method, args))
        try:
            await self._writer.drain()
        except ConnectionError:
            raise self._lost() from None

    async def _read(self) -> None:
        try:
            while True:
                call_id, body = await _read_frame(self._reader)
                kind, value = ("err", body) if isinstance(body, Exception) else body
                if isinstance(value, RemoteFailure):
                    value = raised_remotely(value.exc, value.traceback)
                answer = self._calls.get(call_id)
                if answer is not None:
                    if not answer.done():
                        answer.set_exception(value) if kind == "err" else answer.set_result(value)
                    continue
                items = self._streams.get(call_id)
                if items is not None:
                    items.put_nowait((kind, value))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            log.debug("engine channel to %s closed: %r", self.name, exc)
        finally:
            self._closed = True
            self._writer.close()
            for answer in self._calls.values():
                if not answer.done():
                    answer.set_exception(self._lost())
            for items in self._streams.values():
                items.put_nowait(("err", self._lost()))

    def _lost(self) -> BaseException:
        from ray.exceptions import ActorDiedError

        lost = ActorDiedError()
        lost.add_note(f"(the connection to engine {self.name!r}'s actor closed)")
        return lost
