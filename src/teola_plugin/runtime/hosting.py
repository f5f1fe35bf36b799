"""Where engines live: in this process, or in Ray actors. One scheduling code path for both.

* :class:`EngineSpec` says what to build (a class path and plain kwargs, so it pickles).
* :class:`EngineServer` is the hosted unit: the engine plus its
  :class:`~teola_plugin.runtime.engine_scheduler.EngineScheduler`. It lives in the
  Teola event loop (local hosting) or inside an :class:`EngineActor` (Ray hosting); either
  way every query that uses the engine goes through that one scheduler, which is what
  lets it batch across queries.
* Handles are the client side: :class:`LocalHandle` awaits the server directly,
  :class:`RayHandle` calls the actor. :class:`ReplicaPool` spreads requests over replicas
  of one engine (least outstanding requests first) and pins a stream to its replica.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..engines.base import Engine
from ..errors import ConfigError, EngineInputError, EngineRestartedError
from .engine_scheduler import EngineScheduler
from .policies import BatchPolicy, Priority, default_policy
from .prefix_affinity import PrefixAffinity, prompt_text
from .requests import BatchInfo, StreamOpen

log = logging.getLogger("teola_plugin")
READER_EXIT_WAIT_S = 30.0  # how long close_stream waits for a cancelled reader to let go


@dataclass(frozen=True)
class EngineSpec:
    """What to build: ``factory`` is "module:Class"; ``kwargs`` are plain values."""

    name: str
    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    kind: str = ""
    policy: BatchPolicy | None = None
    replicas: int = 1
    num_cpus: float = 0.0  # Ray resources per replica; 0 lets small engines share a node
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources (placement)
    threads: int | None = None  # CPU threads for the engine's math libraries; None = all cores
    in_process: bool = False  # hosted in the driver's event loop whatever the runtime's hosting
    # Per replica, what differs from ``kwargs`` (a model server's replicas: each its own URL); () none
    replica_kwargs: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if ":" not in self.factory:
            raise ConfigError(f"engine {self.name!r}: factory must be 'module:Class', got {self.factory!r}")
        if self.replicas < 1:
            raise ConfigError(f"engine {self.name!r}: replicas must be >= 1, got {self.replicas}")
        if self.replica_kwargs and len(self.replica_kwargs) != self.replicas:
            raise ConfigError(f"engine {self.name!r}: {len(self.replica_kwargs)} replica_kwargs for "
                              f"{self.replicas} replicas")

    def for_replica(self, index: int) -> EngineSpec:
        """The spec replica ``index`` is built from."""
        if not self.replica_kwargs:
            return self
        return replace(self, kwargs={**self.kwargs, **self.replica_kwargs[index]}, replicas=1, replica_kwargs=())

    def engine_class(self) -> type[Engine]:
        module, _, cls = self.factory.partition(":")
        try:
            found = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"engine {self.name!r}: cannot import {self.factory}: {exc}") from exc
        if not (isinstance(found, type) and issubclass(found, Engine)):
            raise ConfigError(f"engine {self.name!r}: {self.factory} is not an Engine subclass")
        return found

    def build(self) -> Engine:
        return self.engine_class()(name=self.name, **dict(self.kwargs))


class EngineServer:
    """An engine and its scheduler; the same object is hosted locally or in a Ray actor."""

    def __init__(self, spec: EngineSpec, engine: Engine | None = None) -> None:
        self.spec = spec
        self.engine = engine if engine is not None else spec.build()
        policy = spec.policy or default_policy(self.engine.kind)
        self.scheduler = EngineScheduler(spec.name, self.engine.execute, policy, self.engine.request_items)
        self._streams: dict[str, tuple[AsyncIterator[Any], Any]] = {}
        # stream -> the task reading it now, and a future set once that task left the iterator
        self._readers: dict[str, tuple[asyncio.Task[Any], asyncio.Future[None]]] = {}
        # Closed streams whose reader did not let go in time: that reader closes them.
        self._orphans: dict[str, tuple[AsyncIterator[Any], Any]] = {}
        self._aborting: set[asyncio.Task[None]] = set()  # aborts left to run after a cancelled close
        self._stream_ids = itertools.count()
        # Stream ids are unique across replicas and restarts: a stream id of a replica that
        # died must not name a stream that its restarted successor opened for another query.
        self._stream_prefix = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        self._start_lock: asyncio.Lock | None = None

    async def start(self) -> dict[str, Any]:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            await self.engine.start()
        return self.engine.describe()

    async def close(self) -> None:
        for sid in list(self._streams):
            await self.close_stream(sid)
        for sid in list(self._orphans):  # readers that never let go: the engine closes under them
            await self._abort(sid, *self._orphans.pop(sid))
        await self.scheduler.close()
        await self.engine.close()

    async def submit(self, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[Any, BatchInfo]:
        if not self.engine.started:  # e.g. an actor restarted by Ray
            await self.start()
        return await self.scheduler.submit(op, payload, priority)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A direct, unqueued call of a public engine method (setup, metadata)."""
        if method.startswith("_") or not callable(getattr(self.engine, method, None)):
            raise EngineInputError(f"engine {self.spec.name!r} has no public method {method!r}")
        if not self.engine.started and method not in ("start", "describe"):
            await self.start()
        result = getattr(self.engine, method)(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result

    # -- streams: started, resumed elsewhere, always closed ---------------------------------
    async def open_stream(self, method: str, kwargs: Mapping[str, Any], priority: Priority) -> StreamOpen:
        """Start ``engine.<method>(**kwargs)`` (an async iterator) and run it to its first item.

        For LLM generation the first item arrives when the prefill is done, so this is
        the ``llm_prefill`` primitive; :meth:`resume_stream` is the ``llm_decode``.
        """
        if method.startswith("_") or not callable(getattr(self.engine, method, None)):
            raise EngineInputError(f"engine {self.spec.name!r} has no public stream method {method!r}")
        if not self.engine.started:
            await self.start()
        release = await self.scheduler.admit(priority)
        start = time.time()
        if getattr(self.engine, "accepts_priority", False):  # a model server that may schedule by it
            kwargs = {**kwargs, "priority": priority}
        try:
            iterator = getattr(self.engine, method)(**kwargs).__aiter__()
            first = await iterator.__anext__()
        except StopAsyncIteration:
            release()
            return StreamOpen("", [], True, BatchInfo(self.spec.name, -1, 1, start, time.time()))
        except BaseException:
            release()
            raise
        info = BatchInfo(self.spec.name, -1, 1, start, time.time())
        if getattr(first, "finished", False):
            release()
            await iterator.aclose()
            return StreamOpen("", [first], True, info)
        sid = f"{self._stream_prefix}-s{next(self._stream_ids)}"
        self._streams[sid] = (iterator, release)
        return StreamOpen(sid, [first], False, info)

    async def resume_stream(self, sid: str) -> AsyncIterator[Any]:
        """The rest of an opened stream; closing it early aborts the underlying request."""
        if sid not in self._streams:
            if not sid.startswith(self._stream_prefix + "-"):
                raise EngineRestartedError(f"engine {self.spec.name!r} restarted while stream {sid!r} was open "
                                           f"on it; that generation is lost")
            raise EngineInputError(f"no open stream {sid!r} on engine {self.spec.name!r}")
        iterator, _ = self._streams[sid]
        reader = asyncio.current_task()
        exited = asyncio.get_running_loop().create_future()  # set once this reader left the iterator
        if reader is not None:
            self._readers[sid] = (reader, exited)
        try:
            async for item in iterator:
                yield item
                if sid not in self._streams:  # closed meanwhile, and the reader read on
                    break
        finally:
            exited.set_result(None)
            if self._readers.get(sid, (None,))[0] is reader:
                del self._readers[sid]
            orphan = self._orphans.pop(sid, None)
            if orphan is not None:  # close_stream could not abort it while this reader was inside
                await self._abort(sid, *orphan)
            else:
                await self.close_stream(sid)

    async def close_stream(self, sid: str) -> None:
        """Abort and forget a stream. Through Ray the close arrives as its own call while
        another task may be inside the iterator (``aclose`` would fail there): that reader
        is cancelled first, which aborts the engine request where it waits. A reader still
        inside the iterator after ``READER_EXIT_WAIT_S`` (it swallowed the cancellation, or
        the engine's abort hangs) aborts the request itself when it leaves the iterator
        (at its next item at the latest); the slot is freed once the request is aborted."""
        entry = self._streams.pop(sid, None)
        if entry is None:
            return
        iterator = entry[0]
        reading = self._readers.pop(sid, None)
        if reading is not None and reading[0] is not asyncio.current_task():
            reader, exited = reading
            if not reader.done() and not exited.done():
                reader.cancel()
                try:
                    await asyncio.wait({reader, exited}, timeout=READER_EXIT_WAIT_S,
                                       return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:  # this closer was cancelled: the reader finishes the job
                    if self._still_inside(iterator, reader, exited):
                        self._orphans[sid] = entry
                    else:  # ... unless it already left: abort here, in a task this cancel cannot stop
                        task = asyncio.get_running_loop().create_task(self._abort(sid, *entry))
                        self._aborting.add(task)
                        task.add_done_callback(self._aborting.discard)
                    raise
            if self._still_inside(iterator, reader, exited):
                log.warning("stream %s on %s: its reader is still inside it %.0f s after being cancelled; "
                            "the reader aborts it when it leaves", sid, self.spec.name, READER_EXIT_WAIT_S)
                self._orphans[sid] = entry
                return
        await self._abort(sid, *entry)

    @staticmethod
    def _still_inside(iterator: Any, reader: asyncio.Task[Any], exited: asyncio.Future[None]) -> bool:
        """Is the reader still inside the iterator (where ``aclose`` would fail)?"""
        inside = getattr(iterator, "ag_running", None)  # an async generator knows
        return not exited.done() and (inside if inside is not None else not reader.done())

    async def _abort(self, sid: str, iterator: AsyncIterator[Any], release: Any) -> None:
        try:
            await iterator.aclose()  # type: ignore[attr-defined]
        except RuntimeError as exc:  # cannot happen once its reader is done; never keep the slot on it
            log.warning("stream %s on %s: %s", sid, self.spec.name, exc)
        finally:
            release()

    def stats(self) -> dict[str, Any]:
        return {"queued": self.scheduler.queued, "queue_entries": self.scheduler.queue_entries,
                "batches_run": self.scheduler.batches_run, "running": self.scheduler.running,
                "open_streams": len(self._streams) + len(self._orphans), "pid": os.getpid()}


# ---------------------------------------------------------------------------- client side
class EngineHandle(Protocol):
    """Client-side view of one hosted engine replica (:class:`LocalHandle`, ``RayHandle``).
    ``outstanding``: requests and open streams in flight through it (the pool balances on it)."""

    name: str
    outstanding: int = 0

    async def start(self) -> dict[str, Any]: ...
    async def submit(self, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[Any, BatchInfo]: ...
    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...
    async def open_stream(self, method: str, kwargs: Mapping[str, Any], priority: Priority) -> StreamOpen: ...
    def resume_stream(self, sid: str) -> AsyncIterator[Any]: ...
    async def close_stream(self, sid: str) -> None: ...
    async def stats(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...

    async def discard(self) -> None:
        """Stop a replica whose start failed or was abandoned (nothing of it is in use)."""
        await self.close()


class LocalHandle(EngineHandle):
    """The server lives in the caller's event loop."""

    def __init__(self, spec: EngineSpec, engine: Engine | None = None) -> None:
        self.name = spec.name
        self.server = EngineServer(spec, engine)

    @classmethod
    def for_engine(cls, name: str, engine: Engine, policy: BatchPolicy | None = None) -> LocalHandle:
        """Host an engine object built by the caller (not rebuilt from a spec)."""
        cls_ = type(engine)
        spec = EngineSpec(name, f"{cls_.__module__}:{cls_.__qualname__}", kind=engine.kind, policy=policy)
        return cls(spec, engine)

    async def start(self) -> dict[str, Any]:
        return await self.server.start()

    async def submit(self, op, payload, priority):
        return await self.server.submit(op, payload, priority)

    async def call(self, method, *args, **kwargs):
        return await self.server.call(method, *args, **kwargs)

    async def open_stream(self, method, kwargs, priority):
        return await self.server.open_stream(method, kwargs, priority)

    def resume_stream(self, sid):
        return self.server.resume_stream(sid)

    async def close_stream(self, sid):
        await self.server.close_stream(sid)

    async def stats(self) -> dict[str, Any]:
        return self.server.stats()

    async def close(self) -> None:
        await self.server.close()


class ReplicaPool:
    """Replicas of one engine; requests go to the replica with the fewest outstanding, an LLM's
    to the one that has the prompt's prefix cached when it is not much busier (``affinity``)."""

    def __init__(self, name: str, handles: list[EngineHandle], affinity: PrefixAffinity | None = None) -> None:
        if not handles:
            raise ConfigError(f"engine {name!r} has no replicas")
        self.name = name
        self.handles = handles
        self.affinity = affinity if len(handles) > 1 else None
        self._stream_owner: dict[str, EngineHandle] = {}

    def local_engine(self) -> Engine | None:
        """The engine object itself when this pool serves it in this process (its first replica's)."""
        handle = self.handles[0]
        return handle.server.engine if isinstance(handle, LocalHandle) else None

    def _pick(self, route_key: str | None = None, prompt: Mapping[str, Any] | None = None) -> EngineHandle:
        if route_key is not None:  # stateful engines: one index always lives on one replica
            return self.handles[zlib.crc32(route_key.encode()) % len(self.handles)]
        if self.affinity is not None and prompt is not None:
            text = prompt_text(prompt)
            replica = self.affinity.choose(text, [h.outstanding for h in self.handles])
            self.affinity.record(text, replica)
            return self.handles[replica]
        return min(self.handles, key=lambda h: h.outstanding)

    async def start(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(h.start() for h in self.handles)))

    async def submit(
        self, op: str, payload: Mapping[str, Any], priority: Priority, route_key: str | None = None
    ) -> tuple[Any, BatchInfo]:
        handle = self._pick(route_key, payload)  # a prefill warms the replica its request then goes to
        handle.outstanding += 1
        try:
            return await handle.submit(op, payload, priority)
        finally:
            handle.outstanding -= 1

    async def call(self, method: str, *args: Any, route_key: str | None = None, **kwargs: Any) -> Any:
        """Unqueued call: on the replica owning ``route_key``, else on the first one."""
        handle = self._pick(route_key) if route_key is not None else self.handles[0]
        return await handle.call(method, *args, **kwargs)

    async def open_stream(self, method: str, kwargs: Mapping[str, Any], priority: Priority) -> StreamOpen:
        handle = self._pick(prompt=kwargs)
        handle.outstanding += 1
        try:
            opened = await handle.open_stream(method, kwargs, priority)
        except BaseException:
            handle.outstanding -= 1
            raise
        if opened.finished:
            handle.outstanding -= 1
        else:
            self._stream_owner[opened.sid] = handle
        return opened

    async def resume_stream(self, sid: str) -> AsyncIterator[Any]:
        handle = self._stream_owner[sid]
        try:
            async for item in handle.resume_stream(sid):
                yield item
        finally:
            await self.close_stream(sid)

    async def close_stream(self, sid: str) -> None:
        handle = self._stream_owner.pop(sid, None)
        if handle is not None:
            handle.outstanding -= 1
            await handle.close_stream(sid)

    async def stats(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(h.stats() for h in self.handles)))

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.handles), return_exceptions=True)

    async def discard(self) -> None:
        """Stop the replicas of a start that failed or was abandoned (bounded; never raises)."""
        results = await asyncio.gather(*(h.discard() for h in self.handles), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.debug("discarding a replica of %s: %r", self.name, result)
