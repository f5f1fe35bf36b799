"""Ray hosting: an :class:`EngineServer` inside an async actor, and its client handle.

Placement follows the spec's resources (``num_gpus`` for vLLM on GPU nodes, ``num_cpus``
for the rest); Ray restarts a dead actor (``max_restarts``) and the server loads its
engine again on the first call after the restart. The handle retries a request once
after an actor death when the op is idempotent, and the opening of a stream (nothing of
it reached the caller yet); a stream that was cut cannot be resumed, so it fails with
the actor's error.

Cancellation crosses the process boundary: a caller that stops waiting (query cancelled or
timed out) tells the actor, which drops the request from its engine queue or aborts the
stream it opened, so no engine work outlives its query.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from .engine_scheduler import BatchInfo
from .hosting import EngineHandle, EngineServer, EngineSpec
from .policies import Priority, default_policy

log = logging.getLogger("teola_plugin")

# Ops safe to run twice after an actor died mid-request: the reads. (A restarted vector
# store has lost an in-memory index anyway, so a retried insert could not help.)
RESTART_WAIT_S = 60.0  # how long a retry waits for Ray to restart a dead engine actor
IDEMPOTENT_OPS = frozenset({"embed", "search", "rerank", "prefill", "generate"})
_tokens = itertools.count()


class RequestCancelled(Exception):
    """An actor-side answer to a request whose caller had already gone (never seen by it)."""


class EngineActor:
    """The actor body (decorated with ``ray.remote`` at creation time, see :func:`create_actor`)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.server = EngineServer(spec)
        self._inflight: dict[str, asyncio.Task[Any]] = {}  # request token -> its task here
        # Tokens cancelled before their request arrived (calls may overtake each other);
        # bounded, since a cancel can also come after its request finished.
        self._cancelled: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def start(self) -> dict[str, Any]:
        return await self.server.start()

    async def submit(self, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[Any, BatchInfo]:
        return await self.server.submit(op, payload, priority)

    async def submit_many(self, items: list[tuple[str, str, Mapping[str, Any], Priority]]) -> list[tuple[bool, Any]]:
        """Several requests in one actor call; each answers (ok, result or exception)."""

        async def one(token: str, op: str, payload: Mapping[str, Any], priority: Priority) -> tuple[bool, Any]:
            if token in self._cancelled:
                del self._cancelled[token]
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

    def cancel(self, tokens: list[str]) -> None:
        """Drop these requests from the engine queue (or stop waiting for a running batch)."""
        for token in tokens:
            task = self._inflight.get(token)
            if task is not None:
                task.cancel()
            else:
                self._cancelled[token] = None
                while len(self._cancelled) > 10_000:
                    self._cancelled.popitem(last=False)

    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self.server.call(method, *args, **kwargs)

    async def open_stream(self, method: str, kwargs: Mapping[str, Any], priority: Priority):
        return await self.server.open_stream(method, kwargs, priority)

    async def resume_stream(self, sid: str):
        async for item in self.server.resume_stream(sid):
            yield item

    async def close_stream(self, sid: str) -> None:
        await self.server.close_stream(sid)

    async def close(self) -> None:
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
        name=f"teola-engine-{spec.name}-{replica}-{id(spec):x}",
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
            remote_tb = vars(exc).get("traceback_str") or ""  # dual-class instances may lack it
            cause.add_note(f"(raised inside a Ray engine actor){chr(10) + remote_tb if remote_tb else ''}")
            raise cause from None
        raise


class RayHandle(EngineHandle):
    def __init__(self, spec: EngineSpec, replica: int = 0, **actor_options: Any) -> None:
        self.name = spec.name
        self.spec = spec
        self.actor = create_actor(spec, replica, **actor_options)
        self._pending: list[tuple[str, Any, Priority, asyncio.Future[Any], str]] = []
        self._background: set[asyncio.Task[Any]] = set()  # clean-ups of abandoned calls
        engine_class = spec.engine_class()
        self._policy = spec.policy or default_policy(spec.kind or engine_class.kind)
        self._size_of = engine_class.request_items

    async def start(self) -> dict[str, Any]:
        return await _remote(self.actor.start.remote())

    async def submit(self, op, payload, priority):
        """Queue the request for the next coalesced actor call (sent at the next loop turn),
        so primitives dispatched together cost one Ray round trip, not one each."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        token = f"{os.getpid()}-{next(_tokens)}"
        self._pending.append((op, payload, priority, future, token))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            # Not sent yet: _flush skips it. Sent: the actor drops it from its queue.
            if not any(p[3] is future for p in self._pending):
                self._in_background(self._cancel_remote([token]))
            raise

    def _in_background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_remote(self, tokens: list[str]) -> None:
        try:
            await self.actor.cancel.remote(tokens)
        except Exception as exc:  # the actor is gone: so is the request
            log.debug("cancel on %s: %s", self.name, exc)

    def _flush(self) -> None:
        # One actor call answers when all its requests are done, so a group holds only what
        # the engine would run as one batch (its request and item caps): requests bound for
        # later batches travel in their own calls and are not held back by the first ones.
        pending, self._pending = [p for p in self._pending if not p[3].done()], []
        # In the order the engine scheduler will take them, so groups match its batches.
        order = sorted(range(len(pending)), key=lambda i: self._policy.key(pending[i][2], i))
        pending = [pending[i] for i in order]
        loop = asyncio.get_running_loop()
        group: list[tuple[str, Any, Priority, asyncio.Future[Any], str]] = []
        items = 0
        for request in pending:
            n = self._size_of(request[0], request[1])
            full = len(group) >= self._policy.max_batch_size or (
                self._policy.max_batch_items is not None and items + n > self._policy.max_batch_items)
            if group and full:
                loop.create_task(self._send(group, retry=True))
                group, items = [], 0
            group.append(request)
            items += n
        if group:
            loop.create_task(self._send(group, retry=True))

    async def _send(self, batch: list[tuple[str, Any, Priority, asyncio.Future[Any], str]], retry: bool) -> None:
        from ray.exceptions import RayActorError

        try:
            answers = await _remote(self.actor.submit_many.remote([(t, op, p, pr) for op, p, pr, _, t in batch]))
        except RayActorError as exc:
            again = [b for b in batch if b[0] in IDEMPOTENT_OPS] if retry else []
            for op, _, _, future, _ in batch:
                if not future.done() and not (retry and op in IDEMPOTENT_OPS):
                    future.set_exception(exc)
            if again:
                log.warning("engine %s died (%s); retrying %d idempotent request(s) once on the restarted actor",
                            self.name, exc, len(again))
                try:
                    await self._wait_until_alive()
                except RayActorError as still_down:
                    for _, _, _, future, _ in again:
                        if not future.done():
                            future.set_exception(still_down)
                    return
                await self._send([b for b in again if not b[3].done()], retry=False)
            return
        except BaseException as exc:
            for _, _, _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, _, future, _), (ok, value) in zip(batch, answers):
            if not future.done():
                future.set_result(value) if ok else future.set_exception(value)

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

        ref = self.actor.open_stream.remote(method, kwargs, priority)
        try:
            return await _remote(ref)
        except asyncio.CancelledError:
            self._in_background(self._close_abandoned(ref))
            raise
        except RayActorError as exc:
            if not retry:
                raise
            # Nothing of the stream reached the caller yet, so opening it again is safe.
            log.warning("engine %s died (%s); opening the stream again on the restarted actor", self.name, exc)
            await self._wait_until_alive()
            return await self.open_stream(method, kwargs, priority, retry=False)

    async def _close_abandoned(self, ref: Any) -> None:
        """The caller stopped waiting for an open_stream: stop it, or close what it opened."""
        import ray

        try:
            ray.cancel(ref)
        except Exception as exc:
            log.debug("cancel open_stream on %s: %s", self.name, exc)
        try:
            sid, _, finished, _ = await ref
        except Exception:  # cancelled before it opened anything, or the actor died
            return
        if not finished:
            await self.close_stream(sid)

    async def resume_stream(self, sid: str) -> AsyncIterator[Any]:
        gen = self.actor.resume_stream.options(num_returns="streaming").remote(sid)
        async for ref in gen:
            yield await _remote(ref)

    async def close_stream(self, sid: str) -> None:
        try:
            await self.actor.close_stream.remote(sid)
        except Exception as exc:  # the actor may be gone; nothing left to close then
            log.debug("close_stream %s on %s: %s", sid, self.name, exc)

    async def stats(self) -> dict[str, Any]:
        return await _remote(self.actor.stats.remote())

    async def node_id(self) -> str:
        return await self.actor.ping.remote()

    async def close(self) -> None:
        import ray

        try:
            await asyncio.wait_for(self.actor.close.remote(), timeout=30)
        except Exception as exc:
            log.debug("closing engine actor %s: %s", self.name, exc)
        ray.kill(self.actor, no_restart=True)
