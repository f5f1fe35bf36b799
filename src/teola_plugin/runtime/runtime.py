"""The runtime: engines hosted in-process or on Ray, a background event loop, graph runs.

A ``Runtime`` owns one asyncio event loop in a daemon thread (``loop_thread.py``). Everything
asynchronous (graph runs, engine schedulers of locally hosted engines, Ray handles) lives
on it, so synchronous framework code (``query_engine.query``) can call in from any thread
with :meth:`Runtime.run_sync`, and async code with :meth:`Runtime.run_async`. Ray start-up
is ``ray_startup.py``; the engine pools (start, share, drop) are here.

Hosting: ``hosting="ray"`` (default) starts an embedded Ray runtime when the first engine
that needs it starts (no dashboard, every Ray process listening on 127.0.0.1 only, token
authentication unless ``RAY_AUTH_MODE`` says otherwise, sized to this machine;
docs/reliability.md) or connects to ``ray_address``; each engine replica is an actor placed
by its resources. While an embedder's or reranker's actors start, an in-process stand-in of
the same spec serves its requests (``stand_ins.py``). ``hosting="local"`` keeps engines in
the loop thread (tests of pure scheduling, notebooks without Ray). Scheduling is the same
code either way.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from ..errors import ConfigError, EngineStartTimeoutError, QueryTimeoutError
from ..ir.graph import PGraph
from ..ir.node import Primitive
from . import app_runs
from .engine_needs import EngineNeeds
from .engine_starts import SharedStarts, not_started_message, start_problem
from .engine_tuning import tuned
from .graph_scheduler import GraphRun, check_timeout
from .handlers import PrimitiveHandlers
from .hosting import EngineHandle, EngineSpec, LocalHandle, ReplicaPool
from .loop_thread import LoopThread
from .prefix_affinity import PrefixAffinity
from .ray_startup import connect_ray
from .run_observer import RunObserver
from .stand_ins import may_stand_in, retire, start_stand_in
from .timeline import Timeline

log = logging.getLogger("teola_plugin")
T = TypeVar("T")
START_REPORT_S = 60.0  # an engine still starting after this long gets a warning (and again after each)
STOP_STARTS_S = 30.0  # shutdown: how long starts in progress get to stop their replicas
LEFTOVER_TASKS_S = 10.0  # shutdown: how long whatever still runs on the loop gets after a cancel
RETRY_BEHIND_S = 30.0  # a failed actor start behind a stand-in: the earliest retry
RAY_START_AT_EXIT_S = 120.0  # an app ending while Ray starts: how long its exit waits for the start


_BEFORE_SHUTDOWN: list[Callable[["Runtime"], None]] = []


def before_shutdown(hook: Callable[["Runtime"], None]) -> None:
    """Call ``hook(runtime)`` when any runtime starts shutting down, while its engines still
    serve (integrations hand back work that needs them). Registered once per hook."""
    if hook not in _BEFORE_SHUTDOWN:
        _BEFORE_SHUTDOWN.append(hook)


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


def _server_replicas(replicas: Mapping[str, Sequence[str]] | None) -> dict[str, tuple[str, ...]]:
    if replicas is None:
        return {}
    if not isinstance(replicas, Mapping) or not all(
            isinstance(url, str) and not isinstance(more, str) and isinstance(more, Sequence)
            and all(isinstance(u, str) and u for u in more) for url, more in replicas.items()):
        raise ConfigError("server_replicas maps a model server's base URL to a list of the base URLs of its "
                          f"replicas, e.g. {{'http://a:8000/v1': ['http://b:8000/v1']}}; got {replicas!r}")
    return {url.rstrip("/"): tuple(u.rstrip("/") for u in more) for url, more in replicas.items()}


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
        stand_ins: bool = True,
        server_replicas: Mapping[str, Sequence[str]] | None = None,
        direct_channel: bool = True,
    ) -> None:
        """``server_replicas``: a model server's base URL (as the app's model object names it)
        -> the base URLs of more servers of the same model; its requests are spread over all
        of them, each to the one that has its prompt's prefix cached unless that one is
        busier (``prefix_affinity.py``). ``direct_channel``: engine actors on this node take
        their requests over a local socket (``engine_channel.py``); False sends every call
        through Ray."""
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
        self.server_replicas = _server_replicas(server_replicas)
        self.hosting = hosting
        self.ray_address = ray_address
        self.direct_channel = bool(direct_channel)
        self.cost = cost or _default_cost()
        self.timeline = Timeline(max_queries=timeline_queries)
        self.handlers = handlers or PrimitiveHandlers()
        self._pools: dict[str, ReplicaPool] = {}
        self._pool_lock: asyncio.Lock | None = None  # add_local_engine
        self._starts = SharedStarts()  # the engine starts in progress
        self._loop_thread = LoopThread()
        # Ray's processes die with the *thread* that started them (Linux's parent-death signal
        # is per thread), so Ray starts on a thread of its own that lives as long as this
        # runtime: a caller's thread (a background start, a web server's request thread) may
        # end first and take Ray with it. Off the loop, so queries run while Ray starts.
        self._ray_thread = LoopThread("teola-ray")
        self._ray_ready: concurrent.futures.Future[None] | None = None
        self._exit_waits_for_ray = False  # _finish_before_exit registered
        self._owns_ray = False
        self.stand_ins = stand_ins  # serve embedders / rerankers in-process while their actors start
        self._stand_ins: dict[str, ReplicaPool] = {}  # engine name -> its in-process stand-in
        self._behind: dict[str, asyncio.Task[Any]] = {}  # actor starts a stand-in covers for
        self._behind_retry_at: dict[str, float] = {}  # loop time before which a failed one is not retried
        self._retiring: set[ReplicaPool] = set()  # stand-ins answering their last requests
        self._closed = False
        self._start_lock = threading.Lock()
        self._local_objects: dict[str, Any] = {}  # shared_local_engine: name -> engine object
        self._closing: set[asyncio.Task[None]] = set()  # pools closing: collected user objects', stand-ins
        self._cost_model: Any = None  # cost_model(), built once

    # -- loop --------------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._closed:
                raise RuntimeError("this Runtime was shut down")
            if self._loop_thread.loop is None:
                self._loop_thread.start()
                atexit.register(self.shutdown)
            return self._loop_thread.loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The runtime's event loop; None until something needs it (nothing has started)."""
        return self._loop_thread.loop

    @property
    def closed(self) -> bool:
        """``shutdown()`` ran: nothing more runs here."""
        return self._closed

    def start(self) -> "Runtime":
        """Start the loop and connect to (or start) Ray now rather than on first use."""
        self._ensure_loop()
        if self.hosting == "ray":
            self._connect_ray().result()
        return self

    def start_in_background(self, *engines: str) -> concurrent.futures.Future[None]:
        """Start Ray, the loop and the named engines now, without waiting: the first query
        then waits only for what is not ready yet (it joins the starts in progress). The
        future holds the outcome; a failed start is retried by the query that needs it."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def start() -> None:
            try:
                self._ensure_loop()
                ray = self._connect_ray() if self.hosting == "ray" else None
                if engines:
                    self.run_sync(self.start_engines(*engines))
                if ray is not None:
                    ray.result()
                done.set_result(None)
            except BaseException as exc:  # reported through the future (and by the query needing it)
                # a runtime shut down under its start (an app that ended at once) is no news
                (log.debug if self._closed else log.warning)(
                    "background start of %s: %s: %s", list(engines) or "the runtime", type(exc).__name__, exc)
                done.set_exception(exc)

        threading.Thread(target=start, name="teola-start", daemon=True).start()
        return done

    async def aevent_loop(self) -> asyncio.AbstractEventLoop:
        """The runtime's event loop, for async callers: a first start (Ray, seconds) runs on a
        thread, never on the caller's event loop."""
        loop = self._loop_thread.loop
        if loop is not None and not self._closed:
            return loop
        return await asyncio.to_thread(self._ensure_loop)  # raises once shut down

    def in_loop_thread(self) -> bool:
        """Is the caller the runtime loop's own thread (where blocking on the loop would hang)?"""
        return self._loop_thread.in_thread()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        self._ensure_loop()
        return self._loop_thread.submit(coro)

    def run_sync(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run a coroutine on the runtime loop from synchronous code; cancels it on timeout."""
        self._ensure_loop()
        if self.in_loop_thread():
            raise RuntimeError("run_sync called from the runtime loop itself; await the coroutine instead")
        return self._loop_thread.run_sync(coro, timeout)

    async def run_async(self, coro: Awaitable[T]) -> T:
        """Await a coroutine on the runtime loop from another event loop (cancellation forwarded)."""
        await self.aevent_loop()
        return await self._loop_thread.run_async(coro)

    # -- Ray -----------------------------------------------------------------------------------
    def _connect_ray(self) -> concurrent.futures.Future[None]:
        """Connect to (or start) Ray once, on the runtime's Ray thread, without waiting; a
        failed attempt is made again by the next caller."""
        with self._start_lock:
            if self._closed:
                raise RuntimeError("this Runtime was shut down")
            ready = self._ray_ready
            if ready is None or (ready.done() and (ready.cancelled() or ready.exception() is not None)):
                self._ray_thread.start()
                ready = self._ray_ready = self._ray_thread.call_soon(self._init_ray)
                if not self._exit_waits_for_ray:
                    me = weakref.ref(self)  # the exit hook outlives the runtime: no strong reference
                    self._exit_waits_for_ray = _finish_before_exit(
                        lambda: runtime._ray_ready if (runtime := me()) is not None else None)
            return ready

    def _init_ray(self) -> None:
        self._owns_ray = connect_ray(self.ray_address) or self._owns_ray
        # Exit handlers run last-registered first, and importing Ray registered Ray's own
        # shutdown after this runtime's: register ours again so it runs while Ray still
        # serves (closing an actor after Ray's shutdown would start a new Ray at exit).
        atexit.unregister(self.shutdown)
        atexit.register(self.shutdown)

    # -- engines -------------------------------------------------------------------------------
    def engines(self, name: str) -> ReplicaPool:
        """The started pool of engine ``name``, or its in-process stand-in while its actors
        start (the graph scheduler's view of engines)."""
        pool = self._pools.get(name) or self._stand_ins.get(name)
        if pool is None:
            raise ConfigError(f"engine {name!r} is not started; call `await runtime.start_engines({name!r})` "
                              f"(configured: {sorted(self.specs)})")
        return pool

    async def start_engines(self, *names: str) -> dict[str, ReplicaPool]:
        """Create and start the named engines (all configured ones if none is named).

        One start per engine, shared by every caller waiting for it. A caller that stops
        waiting (a query's timeout) leaves the start to the others; when nobody waits any
        more it is cancelled and its replicas stopped, and a start that fails is not
        remembered either: a later call starts afresh, never waits on a dead start."""
        wanted = names or tuple(self.specs)
        for name in wanted:
            if name not in self._pools and name not in self.specs:
                raise ConfigError(f"unknown engine {name!r}; configured: {sorted(self.specs)}")
        for name in wanted:
            if name not in self._pools:
                await self._starts.join(name, lambda: self._start_pool(name), lambda: name in self._pools)
        return {n: self._pools[n] for n in wanted}

    async def _start_pool(self, name: str) -> None:
        spec = self.specs[name] = tuned(self.specs[name], self.cost_model())
        handles: list[EngineHandle]
        if self.hosting == "ray" and not spec.in_process:
            from .ray_hosting import RayHandle

            # shielded: a caller that stops waiting (a query's timeout) must not cancel the
            # one Ray start every other caller waits for
            await asyncio.shield(asyncio.wrap_future(self._connect_ray()))
            handles = [RayHandle(spec.for_replica(i), i, direct=self.direct_channel) for i in range(spec.replicas)]
        else:
            handles = [LocalHandle(spec.for_replica(i)) for i in range(spec.replicas)]
        pool = ReplicaPool(name, handles, PrefixAffinity() if spec.kind == "llm" else None)
        starting = asyncio.ensure_future(pool.start())
        try:
            while True:  # a caller without a timeout waits as long as it takes: say why, now and then
                done, _ = await asyncio.wait({starting}, timeout=START_REPORT_S)
                if done:
                    starting.result()  # the start's own error, if any
                    break
                log.warning("engine %s has not started yet: %s", name, await start_problem(spec, self.hosting))
        except BaseException as exc:
            starting.cancel()
            await asyncio.wait({starting}, timeout=5)
            # Not placed, failed, or nobody waits any more: stop the replicas (a pending Ray
            # actor would otherwise be placed later and hold its resources for nothing).
            # a start nobody waits for any more (the app ended, its query was cancelled or timed
            # out and says so itself) is no news; the next query that needs the engine starts it
            quiet = isinstance(exc, asyncio.CancelledError)
            (log.debug if quiet else log.warning)("engine %s did not start (%s); stopping its replicas",
                                                  name, type(exc).__name__)
            await pool.discard()
            raise
        self._pools[name] = pool
        log.info("engine %s started (%d replica(s), %s)", name, spec.replicas, self.hosting)
        stand_in = self._stand_ins.pop(name, None)
        if stand_in is not None:  # new requests go to the actors; it closes when it has answered
            self._retiring.add(stand_in)
            task = asyncio.get_running_loop().create_task(retire(stand_in))
            task.add_done_callback(lambda _: self._retiring.discard(stand_in))
            self._keep_until_done(task)

    # -- stand-ins (stand_ins.py) ----------------------------------------------------------------
    async def ready(self, *names: str) -> None:
        """Make the named engines servable: started, or (an embedder, a reranker on Ray)
        served by an in-process stand-in while their actors start behind it."""
        others, stand_ins = [], []
        for name in names:
            if name in self._pools:
                continue
            spec = self.specs.get(name)
            # not on a named cluster: the model may exist only on its nodes
            if self.stand_ins and self.ray_address is None and spec is not None and may_stand_in(spec, self.hosting):
                self._start_behind(name)
                if name not in self._stand_ins:
                    stand_ins.append(self._stood_in(name))
            else:
                others.append(name)
        await asyncio.gather(*stand_ins, *([self.start_engines(*others)] if others else []))

    async def _stood_in(self, name: str) -> None:
        """Wait for ``name``'s stand-in (one start shared by every waiter); if it cannot
        start, wait for the engine itself, as without stand-ins."""
        try:
            await self._starts.join(f"{name} (in-process stand-in)", lambda: self._start_stand_in(name),
                                    lambda: name in self._stand_ins or name in self._pools)
        except Exception as exc:  # noqa: BLE001 — reported, then the engine's own start decides
            log.warning("engine %s: no in-process stand-in (%s: %s); waiting for its start",
                        name, type(exc).__name__, exc)
            await self.start_engines(name)

    async def _start_stand_in(self, name: str) -> None:
        pool = await start_stand_in(tuned(self.specs[name], self.cost_model()))
        if name in self._pools or self._closed:  # the actors won the race
            await pool.close()
            return
        self._stand_ins[name] = pool

    def _start_behind(self, name: str) -> None:
        """The engine's own start, which nobody waits for while its stand-in serves; after a
        failure, the next query needing the engine starts it again (not sooner than
        ``RETRY_BEHIND_S``: the stand-in serves meanwhile)."""
        loop = asyncio.get_running_loop()
        if name in self._behind or name in self._pools or loop.time() < self._behind_retry_at.get(name, 0.0):
            return
        task = self._behind[name] = loop.create_task(self.start_engines(name))

        def done(task: asyncio.Task[Any]) -> None:
            self._behind.pop(name, None)
            if not task.cancelled() and task.exception() is not None:
                self._behind_retry_at[name] = loop.time() + RETRY_BEHIND_S
                (log.debug if self._closed else log.warning)(
                    "engine %s did not start on Ray (%s: %s); its in-process stand-in serves it meanwhile",
                    name, type(task.exception()).__name__, task.exception())

        task.add_done_callback(done)

    def _keep_until_done(self, task: asyncio.Task[None]) -> None:
        self._closing.add(task)  # referenced until done (the loop holds tasks weakly)
        task.add_done_callback(self._closing.discard)

    async def _start_within(self, names: list[str], timeout_s: float | None, query_id: str | None) -> float | None:
        """Start a query's missing engines inside its deadline; returns the time left."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                await self.ready(*names)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise EngineStartTimeoutError(await self._not_started(names, timeout_s, query_id)) from None
        if timeout_s is None:
            return None
        left = timeout_s - (loop.time() - began)
        if left <= 0:
            raise EngineStartTimeoutError(await self._not_started(names, timeout_s, query_id))
        return left

    async def _not_started(self, names: list[str], timeout_s: float | None, query_id: str | None) -> str:
        missing = [n for n in names if n not in self._pools and n not in self._stand_ins]
        return await not_started_message(missing, self.specs, self.hosting, timeout_s, query_id)

    async def add_local_engine(self, name: str, engine: Any, policy: Any = None, owner: Any = None) -> ReplicaPool:
        """Serve an already-built engine object from this process (e.g. one wrapping a
        framework's own vector store, which must stay the user's instance). Idempotent per name.
        With ``owner`` (the user's object the engine wraps), the engine is dropped when the
        owner is garbage-collected (:meth:`drop_local_engine_with`)."""
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if name not in self._pools:
                handle = LocalHandle.for_engine(name, engine, policy)
                pool = ReplicaPool(name, [handle])
                await pool.start()
                self._pools[name] = pool
                if owner is not None:
                    self.drop_local_engine_with(owner, name)
        return self._pools[name]

    async def provide(self, needs: EngineNeeds) -> dict[str, Any]:
        """Make the engines a traced graph needs (``needs``, recorded by capture) ready to
        run it: model-server engines configured (they start with the first query that
        uses them), in-process engines built once per name, bound to their retrievers and
        served. Returns the in-process engine objects by name."""
        with self._start_lock:
            for name, spec in needs.served.items():
                self.specs.setdefault(name, self._with_replicas(spec))
        engines = {}
        for name, need in needs.local.items():
            engine = engines[name] = self.shared_local_engine(name, need.make, need.owner)
            for retriever in need.binds:
                engine.bind(retriever)
            await self.add_local_engine(name, engine)
        return engines

    def served_engine(self, endpoint: Any) -> str:
        """The name of the engine that sends requests to ``endpoint`` (a
        :class:`~teola_plugin.engines.llm_served.ServerEndpoint`), configured on first use.
        Only its spec is added here: it starts with the first query that needs it."""
        spec = endpoint.engine_spec()
        with self._start_lock:
            self.specs.setdefault(spec.name, self._with_replicas(spec))
        return spec.name

    def _with_replicas(self, spec: EngineSpec) -> EngineSpec:
        """A model server's engine spec with one replica per URL serving its model (``server_replicas``)."""
        more = self.server_replicas.get(str(spec.kwargs.get("base_url", "")).rstrip("/"))
        if not more:
            return spec
        return replace(spec, replicas=1 + len(more), replica_kwargs=({}, *({"base_url": url} for url in more)))

    def shared_local_engine(self, name: str, make: Callable[[], Any], owner: Any = None) -> Any:
        """The engine object this runtime serves (or will serve) in-process as ``name``, built
        by ``make()`` the first time. An engine wrapping a user's object (a LlamaIndex vector
        store) is one per runtime, so every executor tracing that object binds its
        retrievers on the engine that actually serves it; with ``owner`` it goes when the
        owner is collected."""
        with self._start_lock:
            engine = self._local_objects.get(name)
            if engine is None:
                engine = self._local_objects[name] = make()
                if owner is not None:
                    self.drop_local_engine_with(owner, name)
            return engine

    def drop_local_engine_with(self, owner: Any, name: str) -> None:
        """Forget the in-process engine ``name`` once ``owner`` is garbage-collected: engines
        wrapping a user's store must not keep every per-request index alive. Names derived
        from ``id(owner)`` stay unique: the entries go while the owner is being collected,
        before its id can be reused. An owner without weak references is kept (as before)."""
        me = weakref.ref(self)  # the finalizer must not keep the runtime alive

        def drop() -> None:  # runs on whichever thread drops the last reference: no locks
            runtime = me()
            if runtime is not None:
                runtime._forget_local_engine(name)

        try:
            # not at interpreter exit: shutdown (an atexit hook too) closes every pool then
            weakref.finalize(owner, drop).atexit = False
        except TypeError:
            pass

    def _forget_local_engine(self, name: str) -> None:
        self._local_objects.pop(name, None)
        pool = self._pools.pop(name, None)
        loop = self._loop_thread.loop
        if pool is not None and loop is not None and not loop.is_closed():
            def close() -> None:  # a task kept referenced until done (the loop holds it weakly)
                task = loop.create_task(pool.close())
                self._keep_until_done(task)

            try:  # its scheduler task stops on the loop it runs on
                loop.call_soon_threadsafe(close)
            except RuntimeError:  # the loop is closing: shutdown stops it anyway
                pass

    def local_engines(self) -> dict[str, Any]:
        """The engine objects served in this process (``add_local_engine``, or every started
        engine with ``hosting="local"``), by name: integrations read their settings."""
        # a copy first: a collected user object's finalizer may drop a pool on any thread
        engines = {name: pool.local_engine() for name, pool in list(self._pools.items())}
        return {name: engine for name, engine in engines.items() if engine is not None}

    def cost_model(self, engines: EngineNeeds | None = None) -> Any:
        """The optimizer's cost model for this runtime: default profiles plus which engines
        share hardware (:mod:`.compute_groups`), so passes do not count on overlapping
        engines that compute on the same CPU cores, and what the model servers' engines
        detected of their prefix caches. ``engines``: a trace's needs, not provided yet
        (its model servers count as the runtime's own)."""
        from ..optimizer.cost import CostModel
        from .compute_groups import HOST_CPU, compute_groups

        specs = {**engines.served, **self.specs} if engines else self.specs
        groups = compute_groups(specs)
        caches = self._prefix_caches(specs)
        cached = self._cost_model  # one per runtime: its memo of node costs is reused
        if cached is None or cached.compute_groups != groups or cached.prefix_caches != caches:
            cached = self._cost_model = (CostModel.default().with_compute_groups(groups, default_group=HOST_CPU)
                                         .with_prefix_caches(caches))
        return cached

    def _prefix_caches(self, specs: Mapping[str, EngineSpec]) -> dict[str, Any]:
        """What each model server's engine detected of its prefix cache when it started
        (unknown before: the optimizer then does not count on it)."""
        from ..engines.llm_served import FACTORY
        from ..engines.server_features import PrefixCache

        engines = self.local_engines()
        unknown = PrefixCache(None, 0, "not detected yet: its engine starts with the first query that uses it")
        return {name: getattr(engines.get(name), "prefix_cache", unknown)
                for name, spec in list(specs.items()) if spec.factory == FACTORY}

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
        on_output: Callable[[str, Any], None] | None = None,
        stream_llm_calls: bool = False,
        engines: EngineNeeds | None = None,
        observer: RunObserver | None = None,
    ) -> dict[str, Any]:
        """Run one query's graph (call on the runtime loop, e.g. through run_sync / run_async).
        ``on_token`` receives the text deltas of ``token_nodes``; ``on_output`` each graph
        output as soon as it is ready (name, value); ``stream_llm_calls`` sends every LLM call
        as a streaming request (a framework's callbacks hear its tokens); ``engines`` (its
        trace's needs) are provided first; ``observer`` watches the run node by node."""
        if not isinstance(graph, PGraph):
            raise TypeError(f"execute takes a PGraph, got {type(graph).__name__}")
        if not isinstance(inputs, Mapping):
            raise TypeError(f"execute takes the graph inputs as a dict, got {type(inputs).__name__}")
        timeout_s = check_timeout(timeout_s)
        if engines:
            await self.provide(engines)
        needed = self.engines_for(graph)
        for name in needed & set(self._stand_ins):  # a failed start behind a stand-in is retried
            self._start_behind(name)
        missing = sorted(needed - set(self._pools) - set(self._stand_ins))
        left = await self._start_within(missing, timeout_s, query_id) if missing else timeout_s
        position = app_runs.current()  # the app run the caller is in (its context reaches this loop)
        run = GraphRun(graph, inputs, self.engines, cost=self.cost, timeline=self.timeline,
                       arrival=None if position is None else position.arrival_s,
                       after_s=app_runs.after_s(position), slack_s=app_runs.slack_s(position),
                       handlers=self.handlers, query_id=query_id, timeout_s=left,
                       on_token=on_token, token_nodes=token_nodes, on_output=on_output,
                       stream_llm_calls=stream_llm_calls, start_engines=self.ready, observer=observer)
        try:
            return await run.run()
        except QueryTimeoutError as exc:
            if left != timeout_s:
                exc.add_note(f"(its timeout_s was {timeout_s} s; {timeout_s - left:.3g} s of it went to "
                             f"starting engines {missing})")
            raise

    # -- shutdown ------------------------------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> Runtime:
        """The same runtime: it is the process's engines, not a value (a deep copy of an index
        or a model holding it shares it, as a copy would share a connection pool)."""
        return self

    def shutdown(self) -> None:
        """Close engines, stop the loop, and stop Ray if this runtime started it. Idempotent."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
        for hook in list(_BEFORE_SHUTDOWN):
            hook(self)

        async def close_all() -> None:
            starting = self._starts.tasks()
            for task in starting:  # each stops its replicas
                task.cancel()
            if starting:
                await asyncio.wait(starting, timeout=STOP_STARTS_S)
            pools = [*self._pools.values(), *self._stand_ins.values(), *self._retiring]
            await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
            await _cancel_leftover_tasks(timeout_s=LEFTOVER_TASKS_S)

        from .ray_hosting import CLOSE_BUDGET_S  # the pools close in parallel, each within it

        # the sum of the parts, so the loop never stops under a close still running
        budget = STOP_STARTS_S + CLOSE_BUDGET_S + LEFTOVER_TASKS_S + 5
        self._loop_thread.stop(close_all, budget, lambda exc: log.warning("closing engines: %s", exc))
        self._pools.clear()
        self._stand_ins.clear()
        if self._ray_thread.loop is not None:
            if self._owns_ray or (self._ray_ready is not None and not self._ray_ready.done()):
                import ray

                try:  # on the thread that started it (after a start in progress)
                    self._ray_thread.call(lambda: ray.shutdown() if self._owns_ray else None,
                                         timeout=RAY_START_AT_EXIT_S)
                except Exception as exc:  # noqa: BLE001 — shutting down anyway
                    log.warning("stopping Ray: %s", exc)
                self._owns_ray = False
            self._ray_thread.stop(_nothing, 10, lambda exc: None)


async def _nothing() -> None:
    pass


def _finish_before_exit(ray_start: Callable[[], concurrent.futures.Future[None] | None]) -> bool:
    """An app may end while Ray starts on its thread (a query needed no Ray yet). A Ray start
    that completes inside the interpreter's exit handlers crashes the process (SIGSEGV), so
    the exit waits for the latest start first, before the exit handlers run (where
    ``shutdown`` stops Ray). True once the wait is registered."""

    def wait() -> None:
        start = ray_start()
        if start is not None:
            concurrent.futures.wait([start], timeout=RAY_START_AT_EXIT_S)

    try:
        threading._register_atexit(wait)  # type: ignore[attr-defined]  # runs before atexit's handlers
    except (AttributeError, RuntimeError):  # no such hook, or the interpreter is already exiting
        return False
    return True


async def _cancel_leftover_tasks(timeout_s: float) -> None:
    """At shutdown: cancel what still runs on the loop (queries in flight, their clean-ups),
    bounded, so that stopping the loop leaves no task pending ("Task was destroyed...")."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=timeout_s)


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
