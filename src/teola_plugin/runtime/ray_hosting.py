"""Ray hosting: an :class:`EngineServer` inside an async actor, and its client handle.

Placement follows the spec's resources (``num_gpus`` for vLLM on GPU nodes, ``num_cpus``
for the rest); Ray restarts a dead actor (``max_restarts``) and the server loads its
engine again on the first call after the restart. The handle retries a request once
after an actor death when the op is idempotent, and the opening of a stream (nothing of
it reached the caller yet); a stream that was cut cannot be resumed, so it fails with
the actor's error.

A handle on the actor's node sends the request calls over the actor's direct channel (a
local socket, ``engine_channel.py``: ~0.1 ms a call where Ray's actor call costs ~1 ms); the
same methods answer either way, and the channel's loss reads as Ray's actor death.

Cancellation crosses the process boundary: a caller that stops waiting (query cancelled or
timed out) tells the actor, which drops the request from its engine queue or aborts the
stream it opened, so no engine work outlives its query.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..errors import EngineNotStartedError
from ..recent import Recent
from . import engine_channel
from .engine_channel import ChannelAddress, ChannelServer, EngineChannel
from .hosting import EngineHandle, EngineServer, EngineSpec
from .policies import Priority, default_policy
from .requests import BatchInfo, EngineRequest, StreamOpen

log = logging.getLogger("teola_plugin")

# Ops safe to run twice after an actor died mid-request: the reads. (A restarted vector
# store has lost an in-memory index anyway, so a retried insert could not help.)
RESTART_WAIT_S = 60.0  # how long a retry waits for Ray to restart a dead engine actor
CLOSE_WAIT_S = 10.0  # how long close() lets clean-ups of abandoned calls finish before cancelling them
GRACEFUL_CLOSE_S = 30.0  # how long an engine gets to unload before its actor is killed
CLOSE_BUDGET_S = CLOSE_WAIT_S + 5 + GRACEFUL_CLOSE_S  # the most one close() takes
IDEMPOTENT_OPS = frozenset({"embed", "search", "rerank", "prefill", "generate"})
REMEMBERED_TOKENS = 10_000  # cancelled and stream-opening request tokens an actor remembers
_tokens = itertools.count()
_actor_ids = itertools.count()  # actor names stay unique when a failed start is retried


class RequestCancelled(Exception):
    """An actor-side answer to a request whose caller had already gone (never seen by it)."""


class EngineActor:
    """The actor body (decorated with ``ray.remote`` at creation time, see :func:`create_actor`)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.server = EngineServer(spec)
        self._inflight: dict[str, asyncio.Task[Any]] = {}  # request token -> its task here
        # Tokens cancelled before their request arrived (calls may overtake each other);
        # bounded, since a cancel can also come after its request finished.
        self._cancelled: Recent[bool] = Recent(REMEMBERED_TOKENS)
        # open_stream token -> the stream it opened: a caller cancelled while the answer was
        # on its way never learns the stream id, but its cancel names the token. Bounded.
        self._opened: Recent[str] = Recent(REMEMBERED_TOKENS)
        self._channel: ChannelServer | None = None

    async def start(self) -> dict[str, Any]:
        return await self.server.start()

    async def open_channel(self) -> ChannelAddress | None:
        """Where this actor serves its request calls directly (None: not on this platform)."""
        if not engine_channel.supported():
            return None
        if self._channel is None:
            import ray

            self._channel = ChannelServer(self, ray.get_runtime_context().get_node_id())
        return await self._channel.start()

    async def submit(self, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[Any, BatchInfo]:
        return await self.server.submit(op, payload, priority)

    async def submit_many(self, items: list[tuple[str, str, Mapping[str, Any], Priority]]) -> list[tuple[bool, Any]]:
        """Several requests in one actor call; each answers (ok, result or exception)."""

        async def one(token: str, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[bool, Any]:
            if self._cancelled.pop(token):
                return False, RequestCancelled(f"request {token} was cancelled by its caller")
            self._inflight[token] = asyncio.current_task()  # type: ignore[assignment]
            try:
                return True, await self.server.submit(op, payload, priority)
            except asyncio.CancelledError:
                return False, RequestCancelled(f"request {token} was cancelled by its caller")
            except Exception as exc:
                return False, exc
            finally:
                self._inflight.pop(token, None)

        return list(await asyncio.gather(*(one(*item) for item in items)))

    async def cancel(self, tokens: list[str]) -> None:
        """Drop these requests from the engine queue (or stop waiting for a running batch);
        close the streams they opened; remember the ones that have not arrived yet."""
        for token in tokens:
            task = self._inflight.get(token)
            sid = self._opened.pop(token)
            if task is not None:
                task.cancel()
            elif sid is not None:
                await self.server.close_stream(sid)
            else:
                self._cancelled.put(token, True)

    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self.server.call(method, *args, **kwargs)

    async def open_stream(self, method: str, kwargs: Mapping[str, Any], priority: Priority, token: str | None = None):
        """``EngineServer.open_stream``; with a ``token``, :meth:`cancel` can stop the opening or
        close the stream it opened, whenever the cancel arrives (before, during, after)."""
        if token is None:
            return await self.server.open_stream(method, kwargs, priority)
        nothing = StreamOpen("", [], True, BatchInfo(self.server.spec.name, -1, 1, time.time(), time.time()))
        if self._cancelled.pop(token):  # cancelled before it arrived
            return nothing
        self._inflight[token] = asyncio.current_task()  # type: ignore[assignment]
        try:
            opened = await self.server.open_stream(method, kwargs, priority)
        except asyncio.CancelledError:  # by cancel(): its caller is gone (the server freed the slot)
            return nothing
        finally:
            self._inflight.pop(token, None)
        if not opened.finished:
            self._opened.put(token, opened.sid)
        return opened

    async def resume_stream(self, sid: str):
        async for item in self.server.resume_stream(sid):
            yield item

    async def close_stream(self, sid: str) -> None:
        await self.server.close_stream(sid)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        await self.server.close()

    def stats(self) -> dict[str, Any]:
        return self.server.stats()

    def ping(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def create_actor(spec: EngineSpec, replica: int, max_restarts: int = 3, **options: Any) -> Any:
    import ray

    actor_cls = ray.remote(EngineActor)
    # Ray sets OMP_NUM_THREADS=1 in actors that reserve no CPU, which halves a CPU model's
    # speed on two cores (measured: rerank 0.67 s vs 0.31 s); give the engine its threads.
    threads = spec.threads or os.cpu_count() or 1
    env = {"OMP_NUM_THREADS": str(threads), **options.pop("env_vars", {})}
    return actor_cls.options(
        runtime_env={"env_vars": env},
        name=f"teola-engine-{spec.name}-{replica}-{os.getpid()}-{next(_actor_ids)}",
        num_cpus=spec.num_cpus,
        num_gpus=spec.num_gpus,
        resources=dict(spec.resources) or None,
        max_restarts=max_restarts,
        max_concurrency=1000,  # async actor: concurrency is coroutines, not threads
        **options,
    ).remote(spec)


async def _remote(ref: Any) -> Any:
    """Await an actor call; an engine's exception comes back as itself (same type and
    message, remote traceback attached as a note) rather than wrapped in RayTaskError."""
    from ray.exceptions import RayTaskError

    try:
        return await ref
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            # (dual-class instances may lack traceback_str)
            raise engine_channel.raised_remotely(cause, vars(exc).get("traceback_str") or "") from None
        raise


class RayHandle(EngineHandle):
    """The client of one engine actor. ``direct``: request calls go over the actor's direct
    channel when it runs on this node (else, and for the other calls, through Ray)."""

    def __init__(self, spec: EngineSpec, replica: int = 0, direct: bool = True, **actor_options: Any) -> None:
        self.name = spec.name
        self.spec = spec
        self.actor = create_actor(spec, replica, **actor_options)
        self._direct = direct and engine_channel.supported()  # False once the channel proved unusable
        self._channel: EngineChannel | None = None
        self._connecting: asyncio.Task[EngineChannel | None] | None = None
        self._pending: list[EngineRequest] = []  # coalesced into the next actor call
        self._background: set[asyncio.Task[Any]] = set()  # sends, and clean-ups of abandoned calls
        self._started = False  # False: the actor never answered start (maybe never placed)
        engine_class = spec.engine_class()
        self._policy = spec.policy or default_policy(spec.kind or engine_class.kind)
        self._size_of = engine_class.request_items

    async def start(self) -> dict[str, Any]:
        described = await _remote(self.actor.start.remote())
        self._started = True
        await self._channel_now()  # connected now, not on the first request
        return described

    @property
    def transport(self) -> str:
        """How request calls travel now: "channel" (the direct socket) or "ray"."""
        return "channel" if self._channel is not None and not self._channel.closed else "ray"

    async def _request(self, method: str, *args: Any) -> Any:
        """A request call (``engine_channel.REQUEST_CALLS``): over the channel when there is one."""
        channel = await self._channel_now()
        if channel is not None:
            return await channel.call(method, *args)
        return await _remote(getattr(self.actor, method).remote(*args))

    async def _channel_now(self) -> EngineChannel | None:
        """The open channel to the actor, connected (again, after a restart) when needed; None:
        through Ray. An actor that is dead or restarting fails it with Ray's actor error, as
        the call through Ray would."""
        if not self._direct:
            return None
        channel = self._channel
        if channel is not None and not channel.closed:
            return channel if channel.loop is asyncio.get_running_loop() else None
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
            self._connecting.add_done_callback(lambda _: setattr(self, "_connecting", None))
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> EngineChannel | None:
        import ray
        from ray.exceptions import RayActorError

        try:
            address = await _remote(self.actor.open_channel.remote())
            if address is None or address.node_id != ray.get_runtime_context().get_node_id():
                self._direct = False  # another node (or platform): Ray carries the calls
                return None
            self._channel = await EngineChannel.connect(address, self.name)
            return self._channel
        except RayActorError:
            raise
        except Exception as exc:  # e.g. a network namespace apart: Ray still works
            log.info("engine %s: no direct channel (%s: %s); its calls go through Ray", self.name,
                     type(exc).__name__, exc)
            self._direct = False
            return None

    async def _close_channel(self) -> None:
        self._direct = False
        connecting = self._connecting
        if connecting is not None:  # e.g. to an actor never placed, which never answers
            connecting.cancel()
            await asyncio.wait({connecting}, timeout=5)
        if self._channel is not None:
            await self._channel.close()

    async def submit(self, op, payload, priority):
        """Queue the request for the next coalesced actor call (sent at the next loop turn),
        so primitives dispatched together cost one Ray round trip, not one each."""
        loop = asyncio.get_running_loop()
        request = EngineRequest((), op, payload, priority, loop.create_future(), token=f"{os.getpid()}-{next(_tokens)}")
        self._pending.append(request)
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        try:
            return await request.future
        except asyncio.CancelledError:
            # Not sent yet: _flush skips it. Sent: the actor drops it from its queue.
            if not any(p is request for p in self._pending):
                self._in_background(self._cancel_remote([request.token]))
            raise

    def _in_background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_remote(self, tokens: list[str]) -> None:
        try:
            await self._request("cancel", tokens)
        except Exception as exc:  # the actor is gone: so is the request
            log.debug("cancel on %s: %s", self.name, exc)

    def _flush(self) -> None:
        # One actor call answers when all its requests are done, so a group holds only what
        # the engine would run as one batch (its request and item caps): requests bound for
        # later batches travel in their own calls and are not held back by the first ones.
        pending, self._pending = [p for p in self._pending if not p.future.done()], []
        # In the order the engine scheduler will take them, so groups match its batches.
        for seq, request in enumerate(pending):
            request.key = self._policy.key(request.priority, seq)
        pending.sort()
        group: list[EngineRequest] = []
        items = 0
        for request in pending:
            n = self._size_of(request.op, request.payload)
            if not self._policy.admits(len(group), items, n):
                self._in_background(self._send(group, retry=True))
                group, items = [], 0
            group.append(request)
            items += n
        if group:
            self._in_background(self._send(group, retry=True))

    async def _send(self, batch: list[EngineRequest], retry: bool) -> None:
        try:
            await self._send_once(batch, retry)
        finally:  # cancelled by close(): no caller may wait forever
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(EngineNotStartedError(
                        f"engine {self.name!r} was closed while this request was in flight"))

    async def _send_once(self, batch: list[EngineRequest], retry: bool) -> None:
        from ray.exceptions import RayActorError

        try:
            answers = await self._request("submit_many", [(r.token, r.op, r.payload, r.priority) for r in batch])
        except RayActorError as exc:
            again = [r for r in batch if r.op in IDEMPOTENT_OPS] if retry else []
            for r in batch:
                if not r.future.done() and not (retry and r.op in IDEMPOTENT_OPS):
                    r.future.set_exception(exc)
            if again:
                log.warning("engine %s died (%s); retrying %d idempotent request(s) once on the restarted actor",
                            self.name, exc, len(again))
                try:
                    await self._wait_until_alive()
                except RayActorError as still_down:
                    for r in again:
                        if not r.future.done():
                            r.future.set_exception(still_down)
                    return
                await self._send([r for r in again if not r.future.done()], retry=False)
            return
        except asyncio.CancelledError:  # close(): _send answers the callers
            raise
        except BaseException as exc:
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for r, (ok, value) in zip(batch, answers):
            if not r.future.done():
                r.future.set_result(value) if ok else r.future.set_exception(value)

    async def _wait_until_alive(self, timeout_s: float = RESTART_WAIT_S) -> None:
        """Until Ray has restarted the actor: a call made while it restarts fails at once
        (ActorUnavailableError), so the one retry would be spent on the restart window."""
        from ray.exceptions import RayActorError

        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                await self.actor.ping.remote()
                return
            except RayActorError:  # restarting, or gone for good: bounded by the deadline
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def call(self, method, *args, **kwargs):
        return await _remote(self.actor.call.remote(method, args, kwargs))

    async def open_stream(self, method, kwargs, priority, retry: bool = True):
        from ray.exceptions import RayActorError

        token = f"{os.getpid()}-{next(_tokens)}"
        try:
            return await self._request("open_stream", method, kwargs, priority, token)
        except asyncio.CancelledError:
            # The actor may be opening it, have opened it (the answer on its way: ray.cancel
            # then reports the call cancelled and the stream id is lost), or not have seen
            # the call yet: the token's cancel covers all three.
            self._in_background(self._cancel_remote([token]))
            raise
        except RayActorError as exc:
            if not retry:
                raise
            # Nothing of the stream reached the caller yet, so opening it again is safe.
            log.warning("engine %s died (%s); opening the stream again on the restarted actor", self.name, exc)
            await self._wait_until_alive()
            return await self.open_stream(method, kwargs, priority, retry=False)

    async def resume_stream(self, sid: str) -> AsyncIterator[Any]:
        channel = await self._channel_now()
        if channel is not None:
            async with contextlib.aclosing(channel.stream("resume_stream", sid)) as items:
                async for item in items:
                    yield item
            return
        gen = self.actor.resume_stream.options(num_returns="streaming").remote(sid)
        async for ref in gen:
            yield await _remote(ref)

    async def close_stream(self, sid: str) -> None:
        try:
            await self._request("close_stream", sid)
        except Exception as exc:  # the actor may be gone; nothing left to close then
            log.debug("close_stream %s on %s: %s", sid, self.name, exc)

    async def stats(self) -> dict[str, Any]:
        return await _remote(self.actor.stats.remote())

    async def node_id(self) -> str:
        return await self.actor.ping.remote()

    async def close(self) -> None:
        import ray

        if not ray.is_initialized():  # Ray already stopped, its actors with it (a call would start a new Ray)
            return
        try:
            await self._settle_background(CLOSE_WAIT_S)
            await self._close_channel()
            if self._started:  # else nothing to close gracefully (and an unplaced actor never answers)
                try:
                    await asyncio.wait_for(self.actor.close.remote(), timeout=GRACEFUL_CLOSE_S)
                except Exception as exc:
                    log.debug("closing engine actor %s: %s", self.name, exc)
        finally:  # even when the close itself is cut short: no actor outlives its runtime
            ray.kill(self.actor, no_restart=True)

    async def discard(self) -> None:
        """A replica that never started (not placed, failed, abandoned): kill it at once."""
        import ray

        await self._settle_background(0)
        await self._close_channel()
        if ray.is_initialized():  # else Ray already stopped, its actors with it
            ray.kill(self.actor, no_restart=True)

    async def _settle_background(self, timeout_s: float) -> None:
        """Let in-flight sends and clean-ups (cancels of abandoned calls) finish, up to
        ``timeout_s``; cancel the rest and wait for them, so none is left pending."""
        tasks = set(self._background)
        if tasks and timeout_s > 0:
            _, tasks = await asyncio.wait(tasks, timeout=timeout_s)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
