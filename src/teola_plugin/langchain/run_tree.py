"""A graph run of a lowered chain reports the callback run tree plain LangChain reports.

The trace recorded which component's run each primitive belongs to (``RunScopes``,
``capture/langchain/run_scopes.py``). While the graph runs, :class:`RunTree` (the graph run's
observer):

* starts the run of every lowered glue component (a sequence, a parallel, ``assign``, a
  passthrough, ``StrOutputParser``, a composite retriever) when its parent's run has started
  and its input is known (a sequence step: once the step before it ended, as plain runs
  them), with that input, its name, tag, tags and metadata; and ends it, with its output,
  when its output is known and every run inside it ended;
* runs each primitive that reports a run itself (a model call, a retriever, a prompt, an
  opaque step) with the config of its parent's run in its context (``ensure_config``), so
  that run is its parent's child, as in plain. Such a primitive waits for its parent's run
  to start (and, a sequence step, for the step before to end); nothing else does: engine
  work never waits for a callback;
* on failure, reports ``on_chain_error`` (``on_retriever_error``) for every run still open,
  innermost first, as plain's runs do while the error passes through them; a run a primitive
  opened (``opens_run``: its ``run`` output, a lowered retriever's or model call's, closed by
  the primitive that reads it) is innermost.

A sub-chain met at run time (a ``RunnableBranch``'s chosen branch, a ``RunnableEach``'s
element) runs as an expansion with a run tree of its own, which also reports the sub-chain's
own run (:class:`SubChainRun`), as the branch's / element's ``invoke`` would.

Values a rewrite moved (a stage's shards gathered, a duplicate merged) are read where the
optimized graph computes them (``PGraph.where_is``); one no node computes any more (dead
code) reads as None. Only built when the call's callbacks have handlers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables.config import (RunnableConfig, get_callback_manager_for_config, merge_configs,
                                             patch_config, var_child_runnable_config)

from ..capture.langchain.run_scopes import RunScope, RunScopes
from ..capture.langchain.step_runs import with_step_tag
from ..capture.langchain.values import ChatReply, PendingPrompt, Record, Traced, Value
from ..ir.graph import PGraph
from ..ir.node import INPUT, Primitive, Ref
from ..ir.ops import Op
from ..runtime.framework_threads import in_framework_thread

log = logging.getLogger("teola_plugin.langchain")
REPORTING_OPS = frozenset({Op.OPAQUE, Op.FORMAT})  # the CPU steps that run a component's own code
FINISH_WAIT_S = 30.0  # bound on reporting the last runs' ends after the graph finished


def _shared(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """Await a future other tasks also wait on, or set: a waiter that is cancelled (the graph's
    node tasks, cancelled when the graph run fails) must not cancel the future itself."""
    return asyncio.shield(future)


async def _whole(call: Any) -> tuple[Any, bool]:
    """(result, cancelled) of a handler call that runs to its end even when the awaiting task
    is cancelled meanwhile (the graph run failed): a run the handler started must be known,
    to be ended with the error, and one it is ending must not be errored as well."""
    future = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(future), False
    except asyncio.CancelledError:
        return await future, True


class _HandlerRaised(Exception):
    """A callback handler raised out of LangChain's callback manager, which lets only a
    ``raise_error`` handler's exception through (``error``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


async def _handlers(call: Any) -> Any:
    """Await a callback manager's call; what its handlers raised comes as :class:`_HandlerRaised`."""
    try:
        return await call
    except Exception as exc:
        raise _HandlerRaised(exc) from exc


def listening(config: RunnableConfig) -> bool:
    """Someone hears the call's runs: a handler of its callbacks, or one LangChain's configure
    hooks add to every run (``collect_runs``, LangSmith tracing)."""
    return bool(get_callback_manager_for_config(config).handlers)


@dataclass(frozen=True)
class SubChainRun:
    """The run of a sub-chain a graph expands into: its name, tag and bindings, its input."""

    name: str
    tag: str | None
    bound: Mapping[str, Any] = field(default_factory=dict)
    input: Any = None


class RunTree:
    """One graph run's reporter of the chain's run tree (a ``RunObserver``). ``own``: the
    sub-chain whose run this graph is (None: the chain ``TeolaRunnable`` runs, whose run it
    has started itself)."""

    def __init__(self, scopes: RunScopes, graph: PGraph, config: RunnableConfig,
                 own: SubChainRun | None = None) -> None:
        self.scopes = scopes
        self.graph = graph
        self.config = config  # the caller's context: the chain's run's child config, or the caller's own
        self.own = own
        self._values: dict[Ref, asyncio.Future[Any]] = {}
        self._node_done: dict[str, asyncio.Future[None]] = {}
        # run -> its children's config once it started (None: the chain's own run)
        self._started: dict[int | None, asyncio.Future[RunnableConfig]] = {}
        self._ended: dict[int, asyncio.Future[None]] = {}
        self._open: dict[int | None, Any] = {}  # run -> its run manager, between start and end (in start order)
        self._opened_by: dict[str, Any] = {}  # primitive -> the run manager it opened, until a primitive reads it
        self._tasks: list[asyncio.Task[None]] = []
        self._failure: Exception | None = None  # what a ``raise_error`` handler raised: the call raises it

    # -- the observer ------------------------------------------------------------------------
    def start(self, inputs: Mapping[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        for name, value in inputs.items():
            self._future(Ref(INPUT, name)).set_result(value)
        for run in [None, *self.scopes.runs]:
            self._started[run] = loop.create_future()
        for run in self.scopes.runs:
            self._ended[run] = loop.create_future()
        for node in self.scopes.nodes:
            if node in self.graph:
                self._node_done[node] = loop.create_future()
        if self.own is None:
            self._started[None].set_result(self.config)
        elif self.scopes.root_reports_itself:  # its own code reports its run: with its tag
            self._started[None].set_result(self._tagged(self.config, self.own.tag))
        else:
            self._tasks.append(loop.create_task(self._guarded(None, self._report_own(self.own)),
                                                name=f"run:{self.own.name}"))
        for run in self.scopes.runs.values():
            report = self._report(run) if run.reported else self._follow(run)
            self._tasks.append(loop.create_task(self._guarded(run.id, report), name=f"run:{run.name}"))

    async def entering(self, prim: Primitive) -> None:
        self._raise_failure()
        if prim.op not in REPORTING_OPS:
            return
        run = self.scopes.nodes.get(prim.name)
        if run is not None:
            own = self.scopes.runs[run]
            if not own.reported and own.after is not None:  # its run starts once the step before ended
                await _shared(self._ended[own.after])
        parent = None if run is None else self.scopes.reporter_of(run)
        if parent is not None or self.own is not None:  # else the context already is the chain's run's
            var_child_runnable_config.set(await _shared(self._started[parent]))
        self._raise_failure()

    def produced(self, prim: Primitive, outputs: Mapping[str, Any]) -> None:
        if prim.attrs.get("opens_run") and outputs.get("run") is not None:
            self._opened_by[prim.name] = outputs["run"]
        closed = prim.inputs.get("run")
        if closed is not None:
            self._opened_by.pop(closed.node, None)
        for port in prim.outputs:
            future = self._future(Ref(prim.name, port))
            if not future.done():
                future.set_result(outputs.get(port))
        done = self._node_done.get(prim.name)
        if done is not None and not done.done():
            done.set_result(None)

    async def finish(self, error: BaseException | None) -> None:
        own = self._open.get(None)  # the sub-chain's own run, if this tree started it
        if error is None:
            done, pending = await asyncio.wait(self._tasks, timeout=FINISH_WAIT_S) if self._tasks else (set(), set())
            if pending:
                log.warning("callback runs %s did not end with the graph run", sorted(t.get_name() for t in pending))
        if error is None and self._failure is not None:  # the graph's work was done; plain's call raised
            error = self._failure
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if error is None and own is not None and None in self._open:
            del self._open[None]
            await in_framework_thread(own.on_chain_end, await _shared(self._future(self.graph.outputs["output"])))
        if error is not None:
            # runs a step opened that the step ending them never reached: a lowered retriever's
            # whose search failed, a model call's that the failure stopped (its ``failed``)
            for manager in reversed(list(self._opened_by.values())):
                failed = getattr(manager, "failed", None)
                if failed is not None:
                    await failed(error)
                else:
                    await in_framework_thread(manager.on_retriever_error, error)
            for run, manager in reversed(list(self._open.items())):  # innermost (started last) first
                retriever = run is not None and self.scopes.runs[run].kind == "retriever"
                await in_framework_thread(manager.on_retriever_error if retriever else manager.on_chain_error, error)
        self._open.clear()
        self._opened_by.clear()
        if error is not None and error is self._failure:
            raise self._failure

    def _raise_failure(self) -> None:
        """A ``raise_error`` handler raised while a run was reported: the call fails with its
        exception, as plain's does where the handler's callback fires (work already started on
        the engines for other steps runs on, as after any failure)."""
        if self._failure is not None:
            raise self._failure

    # -- runs ----------------------------------------------------------------------------------
    def _future(self, ref: Ref) -> asyncio.Future[Any]:
        future = self._values.get(ref)
        if future is None:
            future = self._values[ref] = asyncio.get_running_loop().create_future()
        return future

    async def _guarded(self, run: int | None, report: Any) -> None:
        """A run's reporting. A handler that LangChain lets raise (``raise_error = True``: its
        callback manager swallows the others' errors) fails the call with its exception, as it
        fails plain's; another failure is logged and the graph runs on. Either way what waits
        for the run is let go, under the chain's run, so nothing hangs."""
        try:
            await report
            return
        except _HandlerRaised as raised:
            if self._failure is None:
                self._failure = raised.error
        except Exception:  # noqa: BLE001 - callbacks must never hang the query
            log.warning("reporting the callback run %s failed", run, exc_info=True)
        started, ended = self._started.get(run), self._ended.get(run) if run is not None else None
        if started is not None and not started.done():
            started.set_result(self.config)
        if ended is not None and not ended.done():
            ended.set_result(None)

    @staticmethod
    def _tagged(config: RunnableConfig, tag: str | None) -> RunnableConfig:
        return patch_config(config, callbacks=with_step_tag(config.get("callbacks"), tag))

    async def _report_own(self, own: SubChainRun) -> None:
        """Start the sub-chain's own run (its end: ``finish``, with the graph's output)."""
        await self._start(None, self.config, own.bound, own.tag, own.name, "chain", own.input)

    async def _report(self, run: RunScope) -> None:
        """Start ``run`` once its parent started, its input is known and the step before it
        ended; end it once its output is known and everything inside it ended."""
        config = await _shared(self._started[self.scopes.reporter_of(run.parent)])
        input = await self._value(run.input)
        if run.after is not None:
            await _shared(self._ended[run.after])
        handle = await self._start(run.id, config, run.bound, run.tag, run.name, run.kind, input)
        output = await self._inside_done(run)
        end = handle.on_retriever_end if run.kind == "retriever" else handle.on_chain_end
        try:
            _, cancelled = await _whole(_handlers(in_framework_thread(end, output)))
        finally:  # ended (or its end's handler raised, after which plain errors it no more either)
            del self._open[run.id]  # the graph run's failure must not error it as well
            self._ended[run.id].set_result(None)
        if cancelled:
            raise asyncio.CancelledError

    async def _start(self, run: int | None, config: RunnableConfig, bound: Mapping[str, Any], tag: str | None,
                     name: str, kind: str, input: Any) -> Any:
        """Start a run as a child of ``config``'s, with its bindings' names and tags and its own
        tag; its children's config is ready from then on. Returns its run manager."""
        if bound:
            config = merge_configs(config, dict(bound))
        config = self._tagged(config, tag)
        manager = get_callback_manager_for_config(config)
        name = bound.get("run_name") or name
        if kind == "retriever":
            call = in_framework_thread(manager.on_retriever_start, None, input, name=name)
        else:
            run_type = kind if kind in ("parser", "prompt") else None
            call = in_framework_thread(manager.on_chain_start, None, input, name=name, run_type=run_type)
        handle, cancelled = await _whole(_handlers(call))
        self._open[run] = handle  # started: ``finish`` ends it with the graph run's error
        self._started[run].set_result(patch_config(config, callbacks=handle.get_child()))
        if cancelled:
            raise asyncio.CancelledError
        return handle

    async def _follow(self, run: RunScope) -> None:
        """A run its component's own code reports: it has ended once its output is known and
        its primitives (the ones that report it) are done."""
        await self._inside_done(run)
        self._ended[run.id].set_result(None)

    async def _inside_done(self, run: RunScope) -> Any:
        nodes = [n for n, r in self.scopes.nodes.items() if r == run.id and n in self._node_done]
        output = await self._value(run.output)
        for child in self.scopes.children(run.id):
            await _shared(self._ended[child])
        for node in nodes:
            await _shared(self._node_done[node])
        return output

    async def _value(self, value: Value | None) -> Any:
        """The run-time value a traced value stands for."""
        if value is None:
            return None
        if isinstance(value, Traced):
            ref = self.graph.where_is(value.ref)
            return None if ref is None else await _shared(self._future(ref))
        if isinstance(value, Record):  # built as its component builds it (a pick's AddableDict)
            return value.dict_type({k: await self._value(v) for k, v in value.fields})
        if isinstance(value, ChatReply):
            message = await self._value(Traced(value.message)) if value.message is not None else None
            return message if message is not None else AIMessage(content=await self._value(value.text))
        if isinstance(value, PendingPrompt):
            variables = await self._value(value.variables)
            return value.template.format_prompt(**variables)  # no run: the template's run is its own
        raise TypeError(f"not a traced value: {value!r}")
