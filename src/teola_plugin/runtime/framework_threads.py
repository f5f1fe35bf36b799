"""Where framework code called from a graph runs: a thread pool of its own.

Opaque steps (a LangChain runnable's ``invoke``, a LlamaIndex synthesizer), callback
handlers and splitters are blocking framework code, so they leave the runtime loop for a
worker thread. Not the loop's default pool: that pool also runs the in-process engines'
work (``hosting="local"``: the embedder's and reranker's ``asyncio.to_thread``), and an
opaque step that blocks on such an engine (a retriever calling ``TeolaEmbedding``) would,
with as many of them in flight as the pool has threads, wait forever for a thread none of
them gives back. Here they wait on their own pool, and the engines keep theirs.

The caller's context variables travel with each call, as with ``asyncio.to_thread``
(LangChain's callbacks and config, LlamaIndex's instrumentation spans, passthrough flags).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Framework calls in flight at once, over all queries of the process; more wait their turn
# (no deadlock: a framework call never waits for another framework call's thread).
FRAMEWORK_THREADS = 64

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _framework_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=FRAMEWORK_THREADS, thread_name_prefix="teola-framework")
        return _pool


async def in_framework_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``await asyncio.to_thread(fn, ...)``, on the framework pool."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_framework_pool(), call)
