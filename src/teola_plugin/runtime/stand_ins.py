"""In-process stand-ins: a Ray-hosted engine's requests served from this process while its
actors start.

Starting Ray and an actor that imports torch takes ~10 s on a small machine; the same
embedder or reranker loads in this process in ~1 s. So a query that needs such an engine
before its actors are up is served by a stand-in: a replica of the same spec (same class,
model and settings, so the same results) hosted in the runtime's loop, started once and
shared by every query of the warm-up. When the engine's actors are up, new requests go to
them and the stand-in closes as soon as its last request is answered, so the steady state
is the Ray-hosted engine the runtime was configured with.

Only engines that load in seconds on the CPU stand in (embedder, reranker); an engine placed
on GPUs or on custom Ray resources runs where it was asked to, and an LLM engine is never
loaded twice.
"""

from __future__ import annotations

import asyncio
import logging

from .hosting import EngineSpec, LocalHandle, ReplicaPool

log = logging.getLogger("teola_plugin")
STAND_IN_KINDS = frozenset({"embedder", "reranker"})
RETIRE_POLL_S = 0.05
RETIRE_WAIT_S = 600.0  # a stand-in's last request has this long to finish before it closes anyway


def may_stand_in(spec: EngineSpec, hosting: str) -> bool:
    """Whether ``spec``'s engine may be served in-process while its Ray actors start."""
    return (hosting == "ray" and not spec.in_process and spec.kind in STAND_IN_KINDS
            and not spec.num_gpus and not spec.resources)


async def start_stand_in(spec: EngineSpec) -> ReplicaPool:
    """One in-process replica of ``spec``, started."""
    pool = ReplicaPool(spec.name, [LocalHandle(spec)])
    try:
        await pool.start()
    except BaseException:
        await pool.discard()
        raise
    log.info("engine %s: an in-process stand-in serves it while its Ray actors start", spec.name)
    return pool


async def retire(pool: ReplicaPool) -> None:
    """Close a stand-in once the requests it accepted are answered (new ones go elsewhere)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETIRE_WAIT_S
    while any(h.outstanding for h in pool.handles) and loop.time() < deadline:
        await asyncio.sleep(RETIRE_POLL_S)
    await pool.close()
    log.info("engine %s: its Ray actors serve it now; the in-process stand-in closed", pool.name)
