"""Trace LlamaIndex objects into primitive graphs: a registry of lowering rules by component type.

    traced = trace(query_engine, TraceContext(runtime))
    traced.graph            # PGraph, module order kept as `after` edges (optimize() prunes them)
    traced.notes            # which components stayed opaque, and why; what expands at run time

A rule is registered for one exact component type (a subclass may override the very method
the rule reimplements, so it does not inherit the rule) and appends that component's
primitives. A rule may decline with :class:`NotLowerable`; then, as for a type without a
rule, the component becomes one ``opaque`` primitive calling its own method unchanged, and
the rest of the graph is still lowered and optimized.

Fidelity is the contract: lowered primitives compute with LlamaIndex's own code wherever
that code decides something (query construction, node conversion, prompt packing,
prompt rendering), so the engines receive the requests plain LlamaIndex would send.
Nothing here schedules or runs anything.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .common import ComponentNote, NotLowerable, Trace  # noqa: F401  (the rules import NotLowerable from here too)
from ..runtime.caller import as_the_caller_calls, caller_loop
from ..ir.graph import PGraph
from ..ir.node import Primitive, Ref
from ..ir.ops import Op
from ..ir.ports import PortType
from .llama_index_span_events import QueryEvents, retrieve_events, synthesize_events
from .llama_index_spans import SpanPlan
from .module_order import ModuleOrder
from .opaque_warnings import OpaqueWarnings
from .overrides import overridden

logger = logging.getLogger(__name__)  # a child of "teola_plugin"

# -- calls back into the framework ------------------------------------------------------------
_PASSTHROUGH: contextvars.ContextVar[bool] = contextvars.ContextVar("teola_passthrough", default=False)
# Components running their own code in an opaque step (ids): their entry points must not be
# traced again, while the calls they make on *other* components (a sub-question engine's
# sub-queries, a router's chosen engine, a custom retriever's inner retriever) are still
# run by the executor, lowered.
_OWN_CODE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("teola_own_code", default=frozenset())


@contextlib.contextmanager
def framework_passthrough() -> Iterator[None]:
    """Inside, framework entry points run their original code even when an executor is
    installed (the lowering's glue calling the framework's own pieces)."""
    token = _PASSTHROUGH.set(True)
    try:
        yield
    finally:
        _PASSTHROUGH.reset(token)


@contextlib.contextmanager
def running_own_code(component: Any) -> Iterator[None]:
    """Inside, ``component``'s entry points run its original code; other components' still
    go to the executor."""
    token = _OWN_CODE.set(_OWN_CODE.get() | {id(component)})
    try:
        yield
    finally:
        _OWN_CODE.reset(token)


def in_passthrough(component: Any = None) -> bool:
    """Whether a framework call on ``component`` made now runs its original code."""
    return _PASSTHROUGH.get() or (component is not None and id(component) in _OWN_CODE.get())


def framework_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` made safe to run as a lowering's CPU step (it may call framework entry points);
    an async ``fn`` runs inside it as it is awaited."""
    if inspect.iscoroutinefunction(fn):
        async def acall(**inputs: Any) -> Any:
            with framework_passthrough():
                return await fn(**inputs)

        acall.__qualname__ = getattr(fn, "__qualname__", "framework_call")
        return acall

    def call(**inputs: Any) -> Any:
        with framework_passthrough():
            return fn(**inputs)

    call.__qualname__ = getattr(fn, "__qualname__", "framework_call")
    return call


def component_call(component: Any, fn: Callable[..., Any],
                   afn: Callable[..., Awaitable[Any]] | None = None) -> Callable[..., Any]:
    """``fn`` (a call of ``component``'s own method) as an opaque step: the component runs its
    own code, and what it calls on other components is still the executor's to run. With
    ``afn`` (the same call's async method), an async query (``aquery`` / ``aretrieve``) awaits
    ``afn`` on the caller's loop, as plain does (``runtime.caller``)."""
    if afn is None:
        def call(**inputs: Any) -> Any:
            with running_own_code(component):
                return fn(**inputs)
    else:
        async def call(**inputs: Any) -> Any:  # type: ignore[misc]
            with running_own_code(component):
                return await as_the_caller_calls(fn, afn, **inputs)

    call.__qualname__ = getattr(fn, "__qualname__", "component_call")
    return call


# -- what a trace produces ----------------------------------------------------------------------
@dataclass
class TraceContext:
    """What lowering may assume. ``runtime`` is compared by identity only: components bound
    to it lower onto its engines; ``prepare_expansion`` (the executor's optimizer) is applied
    to sub-graphs built at run time."""

    runtime: Any
    prepare_expansion: Callable[[PGraph], PGraph] = lambda graph: graph
    # Join an index's pending ingestion into the graph of a query on it (defer_ingestion).
    join_ingestion: bool = False
    # index -> its pending ingestion state or None (llama_index/pending_ingestion.py).
    pending_of: Callable[[Any], Any] | None = None


@dataclass
class TracedApp(Trace):
    """A LlamaIndex trace: the graph of one query on ``target``, and how to feed it."""

    target: Any
    bound_inputs: dict[str, Any] = field(default_factory=dict)  # values fixed at trace time
    # Set when synthesis streams: the graph outputs the nodes, then this builds the calls.
    streaming_synthesis: Any = None
    # Pending document ingestion this trace saw (capture/llama_index_ingest.py: Join).
    ingestions: list[Any] = field(default_factory=list)
    # The target was lowered by a rule (its own ``_query`` / ``_retrieve`` does not run).
    root_lowered: bool = False
    # Which primitives stand for which of LlamaIndex's own spans (llama_index_spans.py).
    spans: Any = None

    def inputs_for(self, query: Any) -> dict[str, Any]:
        """Graph inputs for one ``QueryBundle``."""
        values: dict[str, Any] = {"query": query, **self.bound_inputs}
        if "embedding_strs" in self.graph.inputs:  # no embedding call when the caller gave one
            values["embedding_strs"] = list(query.embedding_strs) if query.embedding is None else []
        return values


# -- the rule registries ----------------------------------------------------------------------
C = TypeVar("C")
QueryEngineRule = Callable[["LlamaIndexTracer", Any], dict[str, Ref]]  # -> {"response", "nodes"}
RetrieverRule = Callable[["LlamaIndexTracer", Any], Ref]  # -> nodes
PostprocessorRule = Callable[["LlamaIndexTracer", Any, Ref], Ref]  # nodes -> nodes
SynthesizerRule = Callable[["LlamaIndexTracer", Any, Ref], Ref | None]  # nodes -> response (None: streams)

QUERY_ENGINE_RULES: dict[type, QueryEngineRule] = {}
RETRIEVER_RULES: dict[type, RetrieverRule] = {}
POSTPROCESSOR_RULES: dict[type, PostprocessorRule] = {}
SYNTHESIZER_RULES: dict[type, SynthesizerRule] = {}


def lowering_rule(registry: dict[type, C], *types: type) -> Callable[[C], C]:
    """Register ``rule`` for each of ``types`` (exact types) in ``registry``."""
    def register(rule: C) -> C:
        for t in types:
            registry[t] = rule
        return rule

    return register


# -- the tracer ---------------------------------------------------------------------------------
class LlamaIndexTracer:
    """Builds one graph; rules call its helpers. Every primitive waits on the one emitted
    before it (``ModuleOrder``)."""

    def __init__(self, ctx: TraceContext, name: str) -> None:
        self.ctx = ctx
        self.graph = PGraph(name)
        self.order = ModuleOrder(self.graph)
        self.query = self.graph.input("query", PortType.VALUE)  # the QueryBundle
        self.spans = SpanPlan(self.graph)
        self.traced = TracedApp(self.graph, None, spans=self.spans)

    # -- helpers for rules -----------------------------------------------------------------
    def add(self, op: Op, **kwargs: Any) -> Primitive:
        return self.order.add(op, **kwargs)

    def cpu_step(self, name: str, fn: Callable[..., Any], inputs: Mapping[str, Ref], origin: str, *,
                 pure: bool = True, **attrs: Any) -> Ref:
        """Framework code run as-is on the CPU (a lowering's glue; no engine to schedule)."""
        prim = self.order.add(Op.OPAQUE, name=self.graph.unique_name(name), inputs=dict(inputs),
                          attrs={"fn": framework_call(fn), "pure": pure, **attrs}, origin=origin)
        return prim.out()

    def opaque(self, name: str, component: Any, fn: Callable[..., Any], inputs: Mapping[str, Ref],
               reason: str, afn: Callable[..., Awaitable[Any]] | None = None) -> Ref:
        """A component left as it is: one impure primitive calling its own method, ``fn``, or
        under an async query its async method, ``afn`` (the query engines and retrievers it
        calls in turn are still run by the executor)."""
        prim = self.order.add(Op.OPAQUE, name=self.graph.unique_name(name), inputs=dict(inputs),
                          attrs={"fn": component_call(component, fn, afn), "pure": False},
                          origin=type(component).__name__)
        ref = prim.out()
        self.note(ref.node, component, "opaque", reason)
        warn_opaque_once(component, reason)
        return ref

    def note(self, node: str, component: Any, kind: str, reason: str) -> None:
        self.traced.notes.append(ComponentNote(node, type(component).__name__, kind, reason))

    def embedding_strs(self) -> Ref:
        if "embedding_strs" not in self.graph.inputs:
            return self.graph.input("embedding_strs", PortType.TEXTS)
        return Ref("input", "embedding_strs")

    def bind_input(self, name: str, value: Any, type_: PortType) -> Ref:
        """A graph input whose value is fixed at trace time (an index handle)."""
        self.traced.bound_inputs[name] = value
        return self.graph.input(name, type_)

    def trace_nested(self, target: Any) -> TracedApp:
        """``target``'s own trace, for a graph this one runs at run time (a sub-query); pending
        documents of its indexes are stored before the run, not joined into the sub-graph.
        :meth:`adopt` it once the rule keeps it."""
        return trace(target, dataclasses.replace(self.ctx, join_ingestion=False))

    def adopt(self, app: TracedApp, label: str) -> None:
        """A nested trace's engines, notes and pending documents become this trace's."""
        self.traced.engines.update(app.engines)
        self.traced.ingestions.extend(app.ingestions)
        self.traced.notes.extend(dataclasses.replace(n, node=f"{label}/{n.node}") for n in app.notes)

    def on_runtime(self, component: Any) -> bool:
        return getattr(component, "runtime", None) is self.ctx.runtime

    # -- components -------------------------------------------------------------------------
    def _by_rule(self, registry: dict[type, Any], component: Any, what: str, *args: Any) -> tuple[Any, str]:
        """The registered rule's lowering of ``component``, or ``(_DECLINED, why)`` when no
        rule exists or the rule declined; the caller then runs the component as opaque."""
        rule, reason = _find(registry, component, what)
        if rule is not None:
            try:
                return rule(self, component, *args), ""
            except NotLowerable as exc:
                reason = str(exc)
        return _DECLINED, reason

    def lower_query_engine(self, engine: Any, root: bool = False) -> dict[str, Ref]:
        # Lowered, its primitives report the spans its own ``query`` (the entry point reports
        # the outermost one) and ``_query`` open.
        query_span = self.spans.span(engine, "query", args=lambda v: {"str_or_query_bundle": v(self.query)},
                                     events=QueryEvents(self.query)) if not root else contextlib.nullcontext()
        with query_span as outer, self.spans.span(engine, "_query",
                                                  args=lambda v: {"query_bundle": v(self.query)}) as inner:
            lowered, reason = self._by_rule(QUERY_ENGINE_RULES, engine, "query engine")
            _returns(lowered.get("response") if lowered is not _DECLINED else None, outer, inner)
        if lowered is not _DECLINED:
            self.traced.root_lowered |= root
            if root and self.traced.streaming_synthesis is not None:  # the executor's after the graph
                self.spans.drop(inner)
            return lowered
        # The executor's entry point already ran ``query``'s instrumentation around the whole
        # run: the engine itself, unlowered, is its ``_query`` (unless it redefines ``query``).
        from llama_index.core.base.base_query_engine import BaseQueryEngine

        own = lambda method: not root or overridden(engine, BaseQueryEngine, (method,))  # noqa: E731
        sync = engine.query if own("query") else engine._query
        async_ = engine.aquery if own("aquery") else engine._aquery
        call, acall = (lambda query: sync(query)), (lambda query: async_(query))
        response = self.opaque("query_engine", engine, call, {"query": self.query}, reason, acall)
        return {"response": response}

    def lower_retriever(self, retriever: Any, root: bool = False) -> Ref:
        # Lowered, its primitives report the spans of its ``retrieve`` (with its events; the
        # entry point reports a root retriever's) and ``_retrieve``.
        retrieve_span = self.spans.span(retriever, "retrieve", args=lambda v: {"str_or_query_bundle": v(self.query)},
                                        events=retrieve_events(retriever, self.query)) \
            if not root else contextlib.nullcontext()
        with retrieve_span as outer, self.spans.span(retriever, "_retrieve",
                                                     args=lambda v: {"query_bundle": v(self.query)}) as inner:
            lowered, reason = self._by_rule(RETRIEVER_RULES, retriever, "retriever")
            _returns(lowered if lowered is not _DECLINED else None, outer, inner)
        if lowered is not _DECLINED:
            return lowered
        from llama_index.core.base.base_retriever import BaseRetriever

        own = lambda method: not root or overridden(retriever, BaseRetriever, (method,))  # noqa: E731

        def call(query: Any) -> Any:  # ``retrieve`` without the instrumentation the entry point ran
            return retriever._handle_recursive_retrieval(query, retriever._retrieve(query))

        async def acall(query: Any) -> Any:
            return await retriever._ahandle_recursive_retrieval(query, await retriever._aretrieve(query))

        if own("retrieve"):
            call = lambda query: retriever.retrieve(query)  # noqa: E731
        if own("aretrieve"):
            acall = lambda query: retriever.aretrieve(query)  # noqa: E731
        return self.opaque("retrieve", retriever, call, {"query": self.query}, reason, acall)

    def lower_postprocessor(self, postprocessor: Any, nodes: Ref) -> Ref:
        lowered, reason = self._by_rule(POSTPROCESSOR_RULES, postprocessor, "node postprocessor", nodes)
        if lowered is not _DECLINED:
            return lowered
        return self.opaque("postprocess", postprocessor,
                           lambda nodes, query: postprocessor.postprocess_nodes(nodes, query_bundle=query),
                           {"nodes": nodes, "query": self.query}, reason,
                           lambda nodes, query: postprocessor.apostprocess_nodes(nodes, query_bundle=query))

    def lower_synthesizer(self, synthesizer: Any, nodes: Ref) -> Ref | None:
        # Lowered, its primitives report its ``synthesize`` span, with its events.
        with self.spans.span(synthesizer, "synthesize", args=lambda v: {"query": v(self.query), "nodes": v(nodes)},
                             events=synthesize_events(synthesizer, self.query, lambda v: v(nodes))) as span:
            lowered, reason = self._by_rule(SYNTHESIZER_RULES, synthesizer, "response synthesizer", nodes)
            _returns(lowered if lowered is not _DECLINED else None, span)
        if lowered is not _DECLINED:
            return lowered
        return self.opaque("synthesize", synthesizer,
                           lambda query, nodes: synthesizer.synthesize(query, nodes),
                           {"query": self.query, "nodes": nodes}, reason,
                           lambda query, nodes: synthesizer.asynthesize(query, nodes))

    def query_embedding(self, embed_model: Any) -> tuple[str | None, dict[str, Any], str]:
        """Where ``embed_model``'s query embeddings run: (engine, the ``embed`` primitive's
        attributes, why not). On the embedder engine when it computes the same vectors; on
        the served engine of its server for a served model (its own ``get_query_embedding``
        per text, its requests sent by the engine); else (None, {}, the reason)."""
        from .llama_index_models import embedder_engine_for
        from .served_embeddings import embedding_endpoint, is_served_embedding

        engine, why = embedder_engine_for(self.ctx.runtime, embed_model)
        if engine is not None or not is_served_embedding(embed_model):
            return engine, {}, why
        try:
            served = self.traced.engines.served_engine(embedding_endpoint(embed_model))
        except NotLowerable as exc:
            return None, {}, str(exc)
        return served, {"embed_text": embed_model.get_query_embedding}, ""

    def embedding_events(self, embed_model: Any, attrs: dict[str, Any], texts: Ref, vectors: Ref, origin: str,
                         query: Ref | None = None) -> Ref:
        """The embedding events of texts the embedder engine embeds for ``embed_model`` (a
        served model's own ``get_query_embedding`` reports itself); returns the vectors as read
        after them (``vectors`` itself when nothing is reported)."""
        from .llama_index_embed_events import EmbedEvents

        events = EmbedEvents.of(embed_model) if "embed_text" not in attrs else None
        if events is None:
            return vectors
        return events.add_step(self.graph, texts, vectors, origin, query=query)

    def lower_query_vector(self, embed_model: Any, origin: str) -> Ref:
        """The query's search vectors, as ``VectorIndexRetriever._retrieve`` computes its one:
        the caller's embedding if given, else the mean of the embedding strings' embeddings.
        A query with neither (``""``) has none (``[]``): plain then searches without a vector,
        so the caller runs its retriever's own search (see :func:`has_no_vector`)."""
        from llama_index.core.base.embeddings.base import mean_agg

        engine, attrs, why = self.query_embedding(embed_model)
        if engine is not None:
            embed = self.add(Op.EMBED, inputs={"texts": self.embedding_strs()}, engine=engine,
                             attrs={"est_items": 1, **attrs}, origin=type(embed_model).__name__)
            vectors = self.embedding_events(embed_model, attrs, self.embedding_strs(), embed.out(), origin,
                                            query=self.query)

            def query_vector(query: Any, vectors: list[Any]) -> list[Any]:
                if query.embedding is not None:
                    return [query.embedding]
                if not vectors:
                    return []
                return searched_with(query, mean_agg([list(map(float, v)) for v in vectors]))

            return self.cpu_step("query_vector", query_vector, {"query": self.query, "vectors": vectors}, origin)

        def embed_query(query: Any) -> list[Any]:
            if has_no_vector(query):
                return []
            if query.embedding is not None:
                return [query.embedding]
            return searched_with(query, embed_model.get_agg_embedding_from_queries(query.embedding_strs))

        return self.opaque("embed_query", embed_model, embed_query, {"query": self.query}, why)


def searched_with(query: Any, embedding: list[float]) -> list[list[float]]:
    """The query's search vectors: its computed ``embedding``, which a sync retrieve also sets
    on the caller's bundle, as plain's ``_retrieve`` does (its ``_aretrieve`` does not)."""
    if caller_loop() is None:
        query.embedding = embedding
    return [embedding]


def has_no_vector(query: Any) -> bool:
    """A query with neither an embedding nor text to embed (``""``): plain's vector retriever
    then searches its store without a vector (Chroma returns nodes, ``SimpleVectorStore`` raises)."""
    return query.embedding is None and not query.embedding_strs


_DECLINED = object()  # a rule's "no lowering" (a rule may itself return None)


def _returns(ref: Ref | None, *spans: Any) -> None:
    """What the spans' methods return: ``ref``'s value (spans not opened are None)."""
    for span in spans:
        if span is not None:
            span.result = ref
warn_opaque_once = OpaqueWarnings(
    logger, "TeolaExecutor runs %s unchanged as one opaque step (not optimized): %s")


def _find(registry: dict[type, C], component: Any, what: str) -> tuple[C | None, str]:
    rule = registry.get(type(component))
    return rule, "" if rule is not None else f"no lowering rule for this {what} type"


# -- entry point -----------------------------------------------------------------------------
SUPPORTED = ("LlamaIndex query engines (BaseQueryEngine: RetrieverQueryEngine, SubQuestionQueryEngine and "
             "RouterQueryEngine are lowered to primitives, others run as one opaque step whose own query "
             "engine and retriever calls are still Teola's) and retrievers (BaseRetriever: "
             "VectorIndexRetriever, QueryFusionRetriever, BM25Retriever, SummaryIndexRetriever and "
             "AutoMergingRetriever are lowered); chat engines (BaseChatEngine) through executor.chat / achat / "
             "stream_chat / astream_chat, and workflows and agents through their own run(), each run as its own "
             "code with its calls on Teola (no graph of their own to trace: executor.explain(obj) says where "
             "their calls go)")


def trace(target: Any, ctx: TraceContext) -> TracedApp:
    """Lower a query engine (outputs ``response``, ``nodes``) or a retriever (``nodes``)."""
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.base.base_retriever import BaseRetriever

    _register_builtin_rules()
    tracer = LlamaIndexTracer(ctx, type(target).__name__)
    if isinstance(target, BaseQueryEngine):
        for name, ref in tracer.lower_query_engine(target, root=True).items():
            tracer.graph.output(name, ref)
    elif isinstance(target, BaseRetriever):
        tracer.graph.output("nodes", tracer.lower_retriever(target, root=True))
    else:
        raise TypeError(f"cannot trace {type(target).__module__}.{type(target).__qualname__}; "
                        f"supported: {SUPPORTED}")
    tracer.traced.target = target
    tracer.graph.validate()
    return tracer.traced


def _register_builtin_rules() -> None:
    from . import (  # noqa: F401  (register on import)
        llama_index_fusion,
        llama_index_models,
        llama_index_postprocessors,
        llama_index_router,
        llama_index_rules,
        llama_index_sub_question,
        llama_index_transform,
    )
