"""Where framework code called from a graph runs: a thread pool of its own.

Opaque steps (a LangChain runnable's ``invoke``, a LlamaIndex synthesizer), callback
handlers, template renders and splitters are blocking framework code, so they leave the
runtime loop for a worker thread. Not the loop's default pool: that pool also runs the
in-process engines' work (``hosting="local"``: the embedder's and reranker's
``asyncio.to_thread``), and an opaque step that blocks on such an engine (a retriever
calling ``TeolaEmbedding``) would, with as many of them in flight as the pool has threads,
wait forever for a thread none of them gives back. Here they wait on their own pool, and
the engines keep theirs.

A framework call may itself run a graph (an opaque step calling another TeolaRunnable or
query engine) whose framework calls it then waits for: those nested calls get a thread of
their own, so a full pool of outer calls cannot starve their inner ones.

The caller's context variables travel with each call, as with ``asyncio.to_thread``
(LangChain's callbacks and config, LlamaIndex's instrumentation spans, passthrough flags).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Framework calls in flight at once, over all queries of the process; more wait their turn.
FRAMEWORK_THREADS = 64

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
# Set inside a framework call: a graph it runs (its context is copied into the graph's
# tasks) makes nested calls, which must not wait for a thread of the pool it holds.
_IN_FRAMEWORK_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("teola_in_framework_call", default=False)


def _framework_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=FRAMEWORK_THREADS, thread_name_prefix="teola-framework")
        return _pool


def _marked(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    _IN_FRAMEWORK_CALL.set(True)  # in this call's own context copy
    return fn(*args, **kwargs)


def _own_thread(call: Callable[[], T]) -> concurrent.futures.Future[T]:
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            future.set_exception(exc)

    threading.Thread(target=run, name="teola-framework-nested", daemon=True).start()
    return future


async def in_framework_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``await asyncio.to_thread(fn, ...)``, on the framework pool (nested: its own thread)."""
    nested = _IN_FRAMEWORK_CALL.get()
    call = functools.partial(contextvars.copy_context().run, _marked, fn, *args, **kwargs)
    if nested:
        return await asyncio.wrap_future(_own_thread(call))
    return await asyncio.get_running_loop().run_in_executor(_framework_pool(), call)
