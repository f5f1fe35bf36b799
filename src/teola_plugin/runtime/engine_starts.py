"""Engine starts: one start per engine shared by its waiters, and why a start takes long.

Starting an engine (loading a model, placing Ray actors) takes seconds to minutes, and
several queries may need the same engine at once. :class:`SharedStarts` runs one start
per engine, shared by every caller waiting for it. A caller that stops waiting (a query's
timeout) leaves the start to the others; when nobody waits any more it is cancelled and
its replicas stopped, and a start that fails is not remembered either: a later call
starts afresh, never waits on a dead start. The messages below say what a start that
does not finish is waiting for (the resources it asks Ray for, and whether any node has
them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


class EngineStart:
    """One engine's start in progress and how many callers wait for it."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task
        self.waiters = 0
        self.abandoned = False  # cancelled for lack of waiters; still stopping its replicas


class SharedStarts:
    """The engine starts in progress, by engine name."""

    def __init__(self) -> None:
        self.in_progress: dict[str, EngineStart] = {}

    def tasks(self) -> list[asyncio.Task[None]]:
        return [start.task for start in self.in_progress.values()]

    async def join(self, name: str, begin: Callable[[], Awaitable[None]], started: Callable[[], bool]) -> None:
        """Wait for engine ``name``'s start, beginning it (``begin()``) when none runs;
        ``started()`` says whether it is already up."""
        # An abandoned start is still stopping its replicas: let it finish first.
        while (start := self.in_progress.get(name)) is not None and start.abandoned:
            await asyncio.wait({start.task})
        if started():
            return
        if start is None:
            task = asyncio.get_running_loop().create_task(begin(), name=f"start engine {name}")  # type: ignore[arg-type]
            start = self.in_progress[name] = EngineStart(task)
            task.add_done_callback(lambda _: self._forget(name, start))
        start.waiters += 1
        try:
            await asyncio.shield(start.task)
        finally:
            start.waiters -= 1
            if start.waiters == 0 and not start.task.done():
                start.abandoned = True
                start.task.cancel()
                await asyncio.wait({start.task}, timeout=5)  # its replicas are stopped when the caller hears
            elif start.task.done() and not start.task.cancelled():
                start.task.exception()  # retrieved (each waiter already got it)

    def _forget(self, name: str, start: EngineStart) -> None:
        if self.in_progress.get(name) is start:
            del self.in_progress[name]


async def not_started_message(missing: list[str], specs: Mapping[str, Any], hosting: str,
                              timeout_s: float | None, query_id: str | None) -> str:
    """Why a query did not start within its timeout: the engines in ``missing`` (in start order)."""
    parts = [f"engine {name!r} did not start ({await start_problem(specs[name], hosting)})"
             for name in missing[:1]]
    # engines start one after another: the rest never began
    parts += [f"engine {name!r} had not begun starting (it waits for {missing[0]!r})" for name in missing[1:]]
    query = f"query {query_id}" if query_id else "the query"
    return (f"{query} did not start within its timeout_s={timeout_s} s: "
            + "; ".join(parts or ["its engines started, but that took the whole timeout"])
            + ". Give the EngineSpec resources the cluster has, raise timeout_s, or start the engines "
              "beforehand (`await runtime.start_engines(...)`)")


async def start_problem(spec: Any, hosting: str) -> str:
    """What an engine's start waits for (an ``EngineSpec``)."""
    if hosting != "ray":
        return f"{spec.replicas} replica(s) in this process, still loading"
    asked = {"CPU": spec.num_cpus, "GPU": spec.num_gpus, **dict(spec.resources)}
    asked = {k: v for k, v in asked.items() if v}
    what = ", ".join(f"{k}={v:g}" for k, v in asked.items()) or "no reserved resources"
    return f"{spec.replicas} replica(s), each asking Ray for {what}{await _placement_hint(asked)}"


async def _placement_hint(asked: dict[str, float]) -> str:
    if not asked:
        return "; it reserves nothing, so it was still loading"
    try:
        import ray

        # a GCS round trip: off the loop that serves every query, and bounded
        alive = await asyncio.wait_for(asyncio.to_thread(ray.nodes), timeout=5)
        nodes = [n["Resources"] for n in alive if n.get("Alive")]
    except Exception:  # the hint is optional
        return ""
    if any(all(node.get(k, 0) >= v for k, v in asked.items()) for node in nodes):
        return "; a node has them: they may be taken by other actors, or the engine was still loading"
    have = "; ".join(", ".join(f"{k}={node.get(k, 0):g}" for k in asked) for node in nodes)
    return f"; no node of the Ray cluster has them (nodes: {have or 'none'})"
