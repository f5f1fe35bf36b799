"""LlamaIndex's own dispatcher spans around the primitives lowered from the code that opens them.

Plain LlamaIndex nests a query's work in spans (``RetrieverQueryEngine._query`` ->
``VectorIndexRetriever.retrieve`` -> ``._retrieve``; ``CompactAndRefine.synthesize`` ->
``.get_response`` -> ``OpenAILike.predict`` -> ``.chat``), with events of their own
(``RetrievalStartEvent``, ``SynthesizeStartEvent``, the callback manager's ``RETRIEVE`` and
``SYNTHESIZE``), and every event names the span it fired in. Span handlers (Phoenix,
Langfuse) build their traces from exactly that. A lowered query never runs those methods, so
the trace records, while it lowers a component, which primitives stand for which of its
spans (:class:`SpanPlan`, the ``with plan.span(...)`` blocks of the tracer and the
synthesis planner), and :class:`SpanRun`, a graph run's observer, opens each span when its
first primitive is about to run and closes it when its last one is done, in the span
handlers' and event handlers' view the same tree as plain's. Each primitive runs with the
innermost of its spans active (``active_span_id``), so events it fires (an LLM call's, an
embedding's) and spans it opens (the framework code it runs) nest where plain's do; a run
expanded under it (a refine's next call) inherits them.

Primitives the optimizer adds (a prefix warm-up) belong to no span: they are Teola's own.
Spans are reported only when someone listens (:func:`observed`); the plan costs nothing else.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.callbacks.base import global_stack_trace
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.span import SpanDropEvent
from llama_index.core.instrumentation.span import active_span_id

from ..ir.expansion import Expansion
from ..ir.graph import PGraph
from ..ir.node import INPUT, Primitive, Ref
from .llama_index_listening import has_callbacks, has_handlers

try:  # where the instrumentation package keeps its tags (absent in older versions)
    from llama_index_instrumentation.dispatcher import active_instrument_tags
except ImportError:  # pragma: no cover
    active_instrument_tags = None

log = logging.getLogger("teola_plugin")
Values = Callable[[Ref], Any]  # a run's value of a graph ref (None until known)


@dataclass(eq=False)
class FrameworkSpan:
    """One span plain LlamaIndex opens: ``instance.method``, named ``<Class>.<method>-<uuid>``
    on ``dispatcher``. ``args(values)``: its call's arguments; ``result``: what the method
    returns, as span handlers hear it when it exits (a ref, or a function of the run's values
    building the framework's object); ``events``: the start / end events it fires (``start(values) -> state``,
    ``end(state, result, values)``, ``failed(state, exc)``: ``llama_index_span_events.py``);
    ``label``: how code firing an event of it finds it (:func:`span_id_of`)."""

    instance: Any
    method: str
    dispatcher: Any
    args: Callable[[Values], Mapping[str, Any]] = lambda values: {}
    parent: FrameworkSpan | None = None
    events: Any = None
    result: Ref | Callable[[Values], Any] | None = None
    label: str = ""
    awaited: bool = False  # plain awaits it even in a sync call (a fusion's ``use_async`` retrievals)
    entered: EnteredSpan | None = None  # entered while its graph was built (:meth:`SpanPlan.span`)


@dataclass(frozen=True)
class EnteredSpan:
    """A span reported entered (:func:`_enter`). One entered while its graph was built, for code
    that runs inside it at build time in plain (a synthesizer packing its texts in its
    ``get_response``: ``FrameworkSpan.entered``), is taken over by the run's :class:`SpanRun`,
    which exits it when its primitives are done."""

    id_: str
    bound_args: inspect.BoundArguments
    dispatcher: Any


@dataclass
class SpanPlan:
    """The spans of one graph and which of its primitives stand for each (the innermost)."""

    graph: PGraph
    members: dict[str, FrameworkSpan] = field(default_factory=dict)
    _open: list[FrameworkSpan] = field(default_factory=list)
    _awaited: bool = False

    @contextlib.contextmanager
    def span(self, instance: Any, method: str, *, reported: bool = True, entered: bool = False, **kwargs: Any
             ) -> Iterator[FrameworkSpan | None]:
        """Primitives added to the graph inside (and not claimed by a span opened inside
        this one) stand for ``instance.method``'s span; None (and no span) when LlamaIndex
        does not instrument that method. Not ``reported``: a scope of ``events`` only (a
        callback event a method opens around part of its work, in no span of its own).
        ``entered``: the span is entered now, while the graph is built at run time (a
        synthesis expansion), and is the active span inside, so the spans of framework code
        run here to build the graph nest in it (a synthesizer's packing: ``split_text``)."""
        dispatcher = dispatcher_of(instance, method) if reported else None
        if dispatcher is None and reported:
            yield None
            return
        parent = self._open[-1] if self._open else None
        awaited = self._awaited or (parent is not None and parent.awaited)
        span = FrameworkSpan(instance, method, dispatcher, parent=parent, awaited=awaited, **kwargs)
        mark = self.graph.mark()
        self._open.append(span)
        with contextlib.ExitStack() as inside:
            if entered and reported and observed():
                inside.enter_context(self._enter_now(span))
            try:
                yield span
            finally:
                self._open.pop()
                for name in self.graph.added_since(mark):
                    self.members.setdefault(name, span)

    @contextlib.contextmanager
    def _enter_now(self, span: FrameworkSpan) -> Iterator[None]:
        """Enter ``span`` now (its async method's where the running call is async) as the active
        one inside; dropped if building its graph fails (no run will exit it)."""
        instance = span.instance
        method = _called(instance, span.method, running_async() or span.awaited)
        dispatcher = dispatcher_of(instance, method)
        if dispatcher is None:  # plain's async path opens no span here
            yield
            return
        known: Values = lambda ref: None  # noqa: E731  (args known while building are literal)
        entered = span.entered = _enter(dispatcher, instance, method, span.args(known), active_span_id.get())
        token = active_span_id.set(entered.id_)
        try:
            yield
        except BaseException as exc:
            _report_drop(dispatcher, entered.id_, entered.bound_args, instance, exc)
            span.entered = None
            raise
        finally:
            active_span_id.reset(token)

    @contextlib.contextmanager
    def awaited(self, really: bool = True) -> Iterator[None]:
        """Inside (when ``really``), spans stand for what plain awaits whatever the caller's call
        (``aretrieve``, ``_aretrieve``; their primitives report async events): a fusion's
        ``use_async`` retrievals, which its sync ``_retrieve`` runs in an event loop of its own."""
        before, self._awaited = self._awaited, self._awaited or really
        try:
            yield
        finally:
            self._awaited = before

    def drop(self, span: FrameworkSpan | None) -> None:
        """No longer report ``span`` (someone else opens it): its primitives and inner spans
        are its parent's."""
        if span is None:
            return
        for name, member in list(self.members.items()):
            if member is span:
                if span.parent is None:
                    del self.members[name]
                else:
                    self.members[name] = span.parent
        for member in set(self.members.values()):
            while member is not None:
                if member.parent is span:
                    member.parent = span.parent
                member = member.parent

    @contextlib.contextmanager
    def building(self) -> Iterator[SpanPlan]:
        """Inside, :func:`span_in_building` opens spans of this plan (a graph built by code
        that does not hold the plan: an LLM call's helper)."""
        token = _BUILDING.set(self)
        try:
            yield self
        finally:
            _BUILDING.reset(token)

    def observer(self, graph: PGraph, async_: bool | None = None, outer: FrameworkSpan | None = None
                 ) -> SpanRun | None:
        """The observer reporting these spans for a run of ``graph`` (this plan's graph as the
        optimizer left it) of a sync or an ``async_`` call (None: as the run this one expands
        under), inside ``outer`` (the span of the call that runs the graph: a nested query
        engine's ``query``); None when it has no span or nobody listens (to the dispatchers,
        or to the callback events of a span's component)."""
        if not self.members:
            return None
        spans = self.spans() | ({outer} if outer is not None else set())
        entered = any(s.entered is not None for s in spans)  # its run exits them
        if not entered and not observed() and not any(has_callbacks(s.instance) for s in spans if s.events is not None):
            return None
        return SpanRun(self, graph, running_async() if async_ is None else async_, outer)

    def spans(self) -> set[FrameworkSpan]:
        """Every span of the plan: those its primitives stand for and the spans around them."""
        spans: set[FrameworkSpan] = set()
        for span in set(self.members.values()):
            while span is not None:
                spans.add(span)
                span = span.parent
        return spans

    def expansion(self, graph: PGraph) -> Expansion:
        """``graph`` (this plan's, prepared) as an expansion run reporting these spans."""
        return Expansion(graph, {}, observer=self.observer(graph))

    def around(self, instance: Any, method: str, **kwargs: Any) -> FrameworkSpan | None:
        """A span for :meth:`observer`'s ``outer`` (None when LlamaIndex does not instrument
        ``instance.method``)."""
        dispatcher = dispatcher_of(instance, method)
        return FrameworkSpan(instance, method, dispatcher, **kwargs) if dispatcher is not None else None


_BUILDING: contextvars.ContextVar[SpanPlan | None] = contextvars.ContextVar("teola_span_plan", default=None)


def span_in_building(instance: Any, method: str, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
    """:meth:`SpanPlan.span` of the plan being built (:meth:`SpanPlan.building`); no span
    when none is."""
    plan = _BUILDING.get()
    return plan.span(instance, method, **kwargs) if plan is not None else contextlib.nullcontext()


def nested_depth(instance: Any, method: str) -> int:
    """How many ``instance.method`` spans plain nests: one per class down its MRO that
    defines the method instrumented, as long as each override calls ``super()``
    (``OpenAILike.chat``; ``TeolaLLM.chat`` does not: one span)."""
    depth = 0
    for cls in type(instance).__mro__:
        own = cls.__dict__.get(method)
        if own is None:
            continue
        if not getattr(own, "__dispatcher_span_decorated__", False):
            break
        depth += 1
        code = getattr(inspect.unwrap(own), "__code__", None)
        if code is None or "__class__" not in code.co_freevars:  # no zero-argument super(): the last
            break
    return depth


def unspanned(instance: Any, method: str, bound_to: Any = None) -> Callable[..., Any]:
    """``instance.method`` without the span LlamaIndex wraps it in: a lowering's step running a
    component's own code whose span the graph already reports (a retriever's ``_retrieve``);
    ``bound_to``: the object it runs on instead of ``instance`` (a stand-in for it)."""
    return functools.partial(inspect.unwrap(getattr(type(instance), method)),
                             instance if bound_to is None else bound_to)


def model_call_spans(open_span: Callable[..., Any], llm: Any, method: str) -> tuple[Any, Any]:
    """(outer, inner): ``open_span``'s contexts for a model's ``method`` (``chat``,
    ``complete``): its outermost span, where its events fire (label ``llm``), and inside it the
    spans of the instrumented overrides it calls (:func:`nested_depth`), where the engine call sits."""
    @contextlib.contextmanager
    def inner() -> Iterator[list[Any]]:
        with contextlib.ExitStack() as overrides:
            yield [overrides.enter_context(open_span(llm, method)) for _ in range(nested_depth(llm, method) - 1)]

    return open_span(llm, method, label="llm"), inner()


def dispatcher_of(instance: Any, method: str) -> Any:
    """The dispatcher of the module defining ``instance``'s ``method`` when LlamaIndex wraps
    that method in a span (``@dispatcher.span``), else None."""
    fn = getattr(type(instance), method, None)
    if fn is None or not getattr(fn, "__dispatcher_span_decorated__", False):
        return None
    return get_dispatcher(fn.__module__)


def observed() -> bool:
    """A span handler or an event handler on LlamaIndex's dispatchers (the root, where
    handlers are attached, and where every module's dispatcher propagates)."""
    root = get_dispatcher()
    return has_handlers(root, "span_handlers") or has_handlers(root, "event_handlers")


_NO_ARGS = inspect.signature(lambda: None).bind()


@dataclass(eq=False)
class _Opened:
    """A span of a run: opened (reported to ``dispatcher``'s handlers), or standing for one plain's
    path does not open (not ``reported``: its primitives run in its parent's)."""

    span: FrameworkSpan
    id_: str
    bound_args: inspect.BoundArguments
    parent: _Opened | None
    dispatcher: Any = None
    reported: bool = True
    state: Any = None
    closed: bool = False
    # the callback manager's stack of open events inside the span (its own start events
    # pushed), which every primitive of the span runs with: an event they fire nests there
    trace_stack: list[str] | None = None
    # what else reports the span's failure first (an LLM call's callback event it opened)
    on_drop: list[Callable[[BaseException], None]] = field(default_factory=list)


# The spans the running primitive is in (innermost), for code that fires an event of an
# enclosing one (:func:`span_id_of`).
_INSIDE: contextvars.ContextVar[_Opened | None] = contextvars.ContextVar("teola_llama_index_span", default=None)
# Set in a reported run's primitives when the caller's call was async (``aquery``): plain's
# async path opens the async methods' spans (``_aquery``, ``aretrieve``, ``apredict``).
_ASYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("teola_llama_index_async", default=False)


def running_async() -> bool:
    """Whether the running primitive's query was an async call."""
    return _ASYNC.get()


def async_name(method: str) -> str:
    """The async counterpart LlamaIndex names ``method``'s (``_query`` -> ``_aquery``,
    ``retrieve`` -> ``aretrieve``, ``__call__`` -> ``acall``)."""
    if method == "__call__":
        return "acall"
    return "_a" + method[1:] if method.startswith("_") else "a" + method


def when_dropped(report: Callable[[BaseException], None]) -> None:
    """``report(error)`` when the span the running primitive is in fails (before its own
    events; nothing outside a lowered run)."""
    opened = _INSIDE.get()
    if opened is not None:
        opened.on_drop.append(report)


def span_id_of(label: str) -> str | None:
    """The id of the open span labelled ``label`` that the running primitive is in; else the
    active span's (code running outside a lowered run)."""
    opened = _INSIDE.get()
    while opened is not None:
        if opened.span.label == label:
            return opened.id_
        opened = opened.parent
    return active_span_id.get()


class SpanRun:
    """A run's observer (``runtime/run_observer.py``) opening and closing the plan's spans."""

    def __init__(self, plan: SpanPlan, graph: PGraph, async_: bool = False, outer: FrameworkSpan | None = None
                 ) -> None:
        self.plan = plan
        self.async_ = async_
        self.outer = outer  # the parent of the plan's outermost spans
        self.values: dict[Ref, Any] = {}
        self.opened: dict[FrameworkSpan, _Opened] = {}
        self.left: Counter[FrameworkSpan] = Counter()  # primitives of each span (and its inner ones) not done
        for prim in graph.nodes:
            span = plan.members.get(prim.name)
            while span is not None:
                self.left[span] += 1
                span = self._parent(span)

    def _parent(self, span: FrameworkSpan) -> FrameworkSpan | None:
        if span.parent is not None:
            return span.parent
        return self.outer if span is not self.outer else None

    def start(self, inputs: Mapping[str, Any]) -> None:
        self.values.update({Ref(INPUT, name): value for name, value in inputs.items()})

    async def entering(self, prim: Primitive) -> None:
        span = self.plan.members.get(prim.name)
        if span is not None:
            opened = self._open(span)
            active_span_id.set(opened.id_)  # in this primitive's own task context
            _INSIDE.set(opened)
            global_stack_trace.set(opened.trace_stack)
        _ASYNC.set(self.async_ or (span is not None and span.awaited))

    def produced(self, prim: Primitive, outputs: Mapping[str, Any]) -> None:
        for port, value in outputs.items():
            self.values[Ref(prim.name, port)] = value
        span = self.plan.members.get(prim.name)
        while span is not None:
            self.left[span] -= 1
            if self.left[span] == 0 and span in self.opened:
                self._close(self.opened[span])
            span = self._parent(span)

    async def finish(self, error: BaseException | None) -> None:
        for span in self._entered_unopened():  # entered while built, none of their primitives ran: exited too
            self._open(span)
        for opened in reversed(list(self.opened.values())):  # inner ones first
            if not opened.closed:
                self._close(opened) if error is None else self._drop(opened, error)

    # -- spans ------------------------------------------------------------------------------
    def _entered_unopened(self) -> list[FrameworkSpan]:
        """The plan's spans entered while it was built that the run has not opened."""
        return [s for s in self.plan.spans() if s.entered is not None and s not in self.opened]

    def _value(self, ref: Ref) -> Any:
        return self.values.get(ref)

    def _open(self, span: FrameworkSpan) -> _Opened:
        opened = self.opened.get(span)
        if opened is not None:
            return opened
        parent_span = self._parent(span)
        parent = self._open(parent_span) if parent_span is not None else None
        parent_id = parent.id_ if parent is not None else active_span_id.get()
        # the stack the span's events push onto: its parent's (opened by whichever primitive
        # entered it first), or the caller's, which the run's context inherits
        stack = parent.trace_stack if parent is not None else global_stack_trace.get()
        if span.entered is not None:  # entered while the graph was built: its id, args and dispatcher
            entered = span.entered
            opened = _Opened(span, entered.id_, entered.bound_args, parent, dispatcher=entered.dispatcher,
                             trace_stack=stack)
            self.opened[span] = opened
            self._start_events(opened)
            return opened
        instance, method, dispatcher = span.instance, span.method, span.dispatcher
        if dispatcher is not None:
            method = _called(instance, method, self.async_ or span.awaited)
            dispatcher = dispatcher_of(instance, method)
        if dispatcher is None:  # events only, or plain's async path opens no span here (a refine program's acall)
            opened = self.opened[span] = _Opened(span, parent_id, _NO_ARGS, parent, reported=False,
                                                 trace_stack=stack)
            self._start_events(opened)
            return opened
        entered = _enter(dispatcher, instance, method, span.args(self._value), parent_id)
        opened = self.opened[span] = _Opened(span, entered.id_, entered.bound_args, parent, dispatcher=dispatcher,
                                             trace_stack=stack)
        self._start_events(opened)
        return opened

    def _start_events(self, opened: _Opened) -> None:
        if opened.span.events is not None:
            with _active(opened), _reporting(opened.span, "start"):
                opened.state = opened.span.events.start(self._value)
                opened.trace_stack = global_stack_trace.get()  # with the events it opened

    def _close(self, opened: _Opened) -> None:
        opened.closed = True
        span = opened.span
        result = (None if span.result is None else span.result(self._value) if callable(span.result)
                  else self._value(span.result))
        if span.events is not None:
            with _active(opened), _reporting(span, "end"):
                span.events.end(opened.state, result, self._value)
        if not opened.reported:
            return
        opened.dispatcher.span_exit(id_=opened.id_, bound_args=opened.bound_args, instance=span.instance,
                                    result=result)

    def _drop(self, opened: _Opened, error: BaseException) -> None:
        opened.closed = True
        span = opened.span
        for report in opened.on_drop:
            with _active(opened), _reporting(span, "failure"):
                report(error)
        if span.events is not None:
            with _active(opened), _reporting(span, "failure"):
                span.events.failed(opened.state, error)
        if not opened.reported:
            return
        _report_drop(opened.dispatcher, opened.id_, opened.bound_args, span.instance, error)


@contextlib.contextmanager
def _reporting(span: FrameworkSpan, what: str) -> Iterator[None]:
    """Reporting a span's events never fails the query it reports (handlers' errors included)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001
        log.warning("reporting the %s events of %s.%s failed: %r", what, type(span.instance).__name__,
                    span.method, exc)


@contextlib.contextmanager
def _active(opened: _Opened) -> Iterator[None]:
    """``opened`` is the active span while its own events fire, on its callback stack (what
    they push or pop is the span's, not the context's that reports them)."""
    token = active_span_id.set(opened.id_)
    stack_token = global_stack_trace.set(opened.trace_stack)
    try:
        yield
    finally:
        global_stack_trace.reset(stack_token)
        active_span_id.reset(token)


def _called(instance: Any, method: str, async_: bool) -> str:
    """The method plain calls for ``method``: its async counterpart in an async call, where the
    class has one."""
    if async_ and getattr(type(instance), async_name(method), None) is not None:
        return async_name(method)
    return method


def _enter(dispatcher: Any, instance: Any, method: str, args: Mapping[str, Any], parent_id: str | None
           ) -> EnteredSpan:
    """Report ``instance.method``'s span entered with these arguments under ``parent_id``, as
    LlamaIndex's ``dispatcher.span`` names and enters it."""
    try:
        bound = inspect.signature(getattr(instance, method)).bind_partial(**args)
    except (TypeError, ValueError):
        bound = _NO_ARGS
    entered = EnteredSpan(f"{type(instance).__name__}.{method}-{uuid.uuid4()}", bound, dispatcher)
    tags = active_instrument_tags.get() if active_instrument_tags is not None else None
    dispatcher.span_enter(id_=entered.id_, bound_args=bound, instance=instance, parent_id=parent_id, tags=tags)
    return entered


def _report_drop(dispatcher: Any, id_: str, bound_args: inspect.BoundArguments, instance: Any,
                 error: BaseException) -> None:
    """A span dropped with ``error``, as ``dispatcher.span`` reports it."""
    dispatcher.event(SpanDropEvent(span_id=id_, err_str=str(error)))
    dispatcher.span_drop(id_=id_, bound_args=bound_args, instance=instance, err=error)


@contextlib.contextmanager
def instant_span(instance: Any, method: str, *, args: Callable[[Values], Mapping[str, Any]] = lambda values: {},
                 events: Any = None, result: Any = None) -> Iterator[Returned]:
    """``instance.method``'s span (with its ``events``, as :meth:`SpanPlan.span` takes them) around
    what is reported after the fact (an embedding Teola's engine ran; a streaming synthesis's
    ``get_response``, which plain returns before any token is read): opened and closed where it
    runs, nested in the active span, exiting with ``result`` (or what the block sets as the
    yielded record's ``result``); no span when LlamaIndex does not instrument that method."""
    dispatcher = dispatcher_of(instance, method)
    if dispatcher is None:
        yield Returned(result)
        return
    known: Values = lambda ref: None  # noqa: E731  (nothing of a graph run: the args are literal)
    entered = _enter(dispatcher, instance, method, args(known), active_span_id.get())
    token = active_span_id.set(entered.id_)
    returned = Returned(result)
    try:
        state = events.start(known) if events is not None else None
        yield returned
        if events is not None:
            events.end(state, None, known)
    finally:
        active_span_id.reset(token)
        dispatcher.span_exit(id_=entered.id_, bound_args=entered.bound_args, instance=instance, result=returned.result)


@dataclass
class Returned:
    """What an :func:`instant_span`'s method returns, when known only inside it."""

    result: Any = None
