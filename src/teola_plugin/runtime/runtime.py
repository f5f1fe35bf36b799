"""The runtime: engines hosted in-process or on Ray, a background event loop, graph runs.

A ``Runtime`` owns one asyncio event loop in a daemon thread ("teola-loop"). Everything
asynchronous (graph runs, engine schedulers of locally hosted engines, Ray handles) lives
on it, so synchronous framework code (``query_engine.query``) can call in from any thread
with :meth:`Runtime.run_sync`, and async code with :meth:`Runtime.run_async`.

Hosting: ``hosting="ray"`` (default) starts an embedded Ray runtime on first use (no
dashboard, node address 127.0.0.1, token authentication unless ``RAY_AUTH_MODE`` says
otherwise, sized to this machine; docs/reliability.md says which ports it opens) or
connects to ``ray_address``; each
engine replica is an actor placed by its resources. ``hosting="local"`` keeps engines in
the loop thread (tests of pure scheduling, notebooks without Ray). Scheduling is the same
code either way.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from ..errors import ConfigError
from ..ir.graph import PGraph
from ..ir.node import Primitive
from .graph_scheduler import GraphRun, check_timeout
from .handlers import PrimitiveHandlers
from .hosting import EngineHandle, EngineSpec, LocalHandle, ReplicaPool
from .timeline import Timeline

log = logging.getLogger("teola_plugin")
T = TypeVar("T")


def default_engine_specs(llm_model: str | None = None, num_gpus_llm: float | None = None) -> dict[str, EngineSpec]:
    """The five engines of the paper's apps, with their default models. vLLM gets one GPU
    when this machine has one (Ray hides GPUs from actors that did not ask for them)."""
    if num_gpus_llm is None:
        num_gpus_llm = 1.0 if _cuda_devices() > 0 else 0.0
    return {
        "llm": EngineSpec("llm", "teola_plugin.engines.llm_vllm:VLLMEngine",
                          {"model": llm_model} if llm_model else {}, kind="llm", num_gpus=num_gpus_llm),
        "embedder": EngineSpec("embedder", "teola_plugin.engines.embedder:SentenceTransformerEmbedder", kind="embedder"),
        "vector_store": EngineSpec("vector_store", "teola_plugin.engines.vector_store:ChromaVectorStore", kind="vector_store"),
        "reranker": EngineSpec("reranker", "teola_plugin.engines.reranker:Reranker", kind="reranker"),
        "search": EngineSpec("search", "teola_plugin.engines.search:BM25SearchEngine", kind="search"),
    }


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast on an address nothing listens on: ray.init itself retries for ~2 minutes."""
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ray_address must look like 'host:port', 'ray://host:port' or 'auto', got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a CPU-only torch build, or none
        return 0


class Runtime:
    def __init__(
        self,
        engines: Mapping[str, EngineSpec] | None = None,
        *,
        hosting: str = "ray",
        ray_address: str | None = None,
        cost: Callable[[Primitive], float] | None = None,
        timeline_queries: int = 1000,
        handlers: PrimitiveHandlers | None = None,
    ) -> None:
        if hosting not in ("ray", "local"):
            raise ConfigError(f"hosting must be 'ray' or 'local', got {hosting!r}")
        if ray_address is not None and (hosting != "ray" or not isinstance(ray_address, str)):
            raise ConfigError(f"ray_address must be a str such as 'host:6379' and needs hosting='ray'; "
                              f"got {ray_address!r} with hosting={hosting!r}")
        if engines is not None and not isinstance(engines, Mapping):
            raise ConfigError(f"engines must map names to EngineSpec, got {type(engines).__name__}")
        if engines is not None:
            for key, spec in engines.items():
                if not isinstance(key, str) or not isinstance(spec, EngineSpec):
                    raise ConfigError(f"engines must map str names to EngineSpec; {key!r} -> {type(spec).__name__}")
        if cost is not None and not callable(cost):
            raise ConfigError(f"cost must be a function of a Primitive, got {type(cost).__name__}")
        if handlers is not None and not isinstance(handlers, PrimitiveHandlers):
            raise ConfigError(f"handlers must be a PrimitiveHandlers, got {type(handlers).__name__}")
        self.specs = dict(engines if engines is not None else default_engine_specs())
        self.hosting = hosting
        self.ray_address = ray_address
        self.cost = cost or _default_cost()
        self.timeline = Timeline(max_queries=timeline_queries)
        self.handlers = handlers or PrimitiveHandlers()
        self._pools: dict[str, ReplicaPool] = {}
        self._pool_lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._owns_ray = False
        self._closed = False
        self._start_lock = threading.Lock()

    # -- loop --------------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._closed:
                raise RuntimeError("this Runtime was shut down")
            if self._loop is None:
                if self.hosting == "ray":
                    self._init_ray()
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="teola-loop", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
                atexit.register(self.shutdown)
            return self._loop

    def start(self) -> "Runtime":
        """Start the loop and connect to (or start) Ray now rather than on first use."""
        self._ensure_loop()
        return self

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())  # type: ignore[arg-type]

    def run_sync(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run a coroutine on the runtime loop from synchronous code; cancels it on timeout."""
        self._ensure_loop()
        if threading.current_thread() is self._thread:
            raise RuntimeError("run_sync called from the runtime loop itself; await the coroutine instead")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except (concurrent.futures.TimeoutError, KeyboardInterrupt):
            future.cancel()
            raise

    async def run_async(self, coro: Awaitable[T]) -> T:
        """Await a coroutine on the runtime loop from another event loop (cancellation forwarded)."""
        loop = self._ensure_loop()
        try:
            if asyncio.get_running_loop() is loop:
                return await coro
        except RuntimeError:
            pass
        future = self.submit(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    # -- Ray -----------------------------------------------------------------------------------
    def _init_ray(self) -> None:
        import ray

        if self.ray_address is not None:
            _check_reachable(self.ray_address)
        if ray.is_initialized():
            # One process joins one cluster: another Runtime (or the user) connected it.
            current = ray.get_runtime_context().gcs_address
            if self.ray_address not in (None, "auto") and self.ray_address.split("://")[-1] != current:
                raise ConfigError(f"this process is already connected to the Ray cluster at {current!r}; "
                                  f"it cannot also join {self.ray_address!r}")
            return
        if self.ray_address is None and "RAY_AUTH_MODE" not in os.environ:
            # Ray's gRPC servers listen on every interface whatever the node address, and
            # ray.init turns token authentication on for a new local cluster when the mode
            # is unset. The token: a fresh one per process, kept in this process's
            # environment (inherited by Ray's workers) rather than ~/.ray/auth_token.
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        elif self.ray_address is not None:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        if self.ray_address is not None:
            try:
                ray.init(address=self.ray_address, ignore_reinit_error=True, log_to_driver=False)
            except Exception as exc:
                raise ConfigError(f"cannot connect to the Ray cluster at {self.ray_address!r}: {exc}") from exc
        else:
            # Embedded: a new local instance ("local": without it ray.init joins whatever
            # cluster `ray start` last left in /tmp/ray, someone else's included), no
            # dashboard, node address 127.0.0.1, sized to the machine.
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                     log_to_driver=False, ignore_reinit_error=True)
        self._owns_ray = True

    # -- engines -------------------------------------------------------------------------------
    def engines(self, name: str) -> ReplicaPool:
        """The started pool of engine ``name`` (the graph scheduler's view of engines)."""
        pool = self._pools.get(name)
        if pool is None:
            raise ConfigError(f"engine {name!r} is not started; call `await runtime.start_engines({name!r})` "
                              f"(configured: {sorted(self.specs)})")
        return pool

    async def start_engines(self, *names: str) -> dict[str, ReplicaPool]:
        """Create and start the named engines (all configured ones if none is named)."""
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        wanted = names or tuple(self.specs)
        async with self._pool_lock:
            for name in wanted:
                if name in self._pools:
                    continue
                if name not in self.specs:
                    raise ConfigError(f"unknown engine {name!r}; configured: {sorted(self.specs)}")
                spec = self.specs[name]
                handles: list[EngineHandle]
                if self.hosting == "ray":
                    from .ray_hosting import RayHandle

                    handles = [RayHandle(spec, i) for i in range(spec.replicas)]
                else:
                    handles = [LocalHandle(spec) for _ in range(spec.replicas)]
                pool = ReplicaPool(name, handles)
                await pool.start()
                self._pools[name] = pool
                log.info("engine %s started (%d replica(s), %s)", name, spec.replicas, self.hosting)
        return {n: self._pools[n] for n in wanted}

    async def add_local_engine(self, name: str, engine: Any, policy: Any = None) -> ReplicaPool:
        """Serve an already-built engine object from this process (e.g. one wrapping a
        framework's own vector store, which must stay the user's instance). Idempotent per name."""
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if name not in self._pools:
                handle = LocalHandle.for_engine(name, engine, policy)
                pool = ReplicaPool(name, [handle])
                await pool.start()
                self._pools[name] = pool
        return self._pools[name]

    def engines_for(self, graph: PGraph) -> set[str]:
        return {p.engine for p in graph.nodes if p.kind != "cpu"}

    # -- graphs --------------------------------------------------------------------------------
    async def execute(
        self,
        graph: PGraph,
        inputs: Mapping[str, Any],
        *,
        query_id: str | None = None,
        timeout_s: float | None = None,
        on_token: Callable[[str], None] | None = None,
        token_nodes: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """Run one query's graph (call on the runtime loop, e.g. through run_sync / run_async)."""
        if not isinstance(graph, PGraph):
            raise TypeError(f"execute takes a PGraph, got {type(graph).__name__}")
        if not isinstance(inputs, Mapping):
            raise TypeError(f"execute takes the graph inputs as a dict, got {type(inputs).__name__}")
        check_timeout(timeout_s)
        await self.start_engines(*sorted(self.engines_for(graph) - set(self._pools)))
        run = GraphRun(graph, inputs, self.engines, cost=self.cost, timeline=self.timeline,
                       handlers=self.handlers, query_id=query_id, timeout_s=timeout_s,
                       on_token=on_token, token_nodes=token_nodes)
        return await run.run()

    # -- shutdown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close engines, stop the loop, and stop Ray if this runtime started it. Idempotent."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            async def close_all() -> None:
                await asyncio.gather(*(p.close() for p in self._pools.values()), return_exceptions=True)

            try:
                asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=60)
            except Exception as exc:  # shutting down anyway
                log.warning("closing engines: %s", exc)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._pools.clear()
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False


_DEFAULT: Runtime | None = None
_DEFAULT_LOCK = threading.Lock()


def default_runtime() -> Runtime:
    """The process-wide runtime that plugin classes share (the LLM class, the executors),
    so a plain framework app and its Teola run use the same engines."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT._closed:
            _DEFAULT = Runtime()
        return _DEFAULT


def _default_cost() -> Callable[[Primitive], float]:
    try:
        from ..optimizer.cost import CostModel

        return CostModel.default().node_cost
    except (ImportError, AttributeError):  # the optimizer is optional for running a graph
        return lambda prim: 0.0
