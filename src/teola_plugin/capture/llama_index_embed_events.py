"""LlamaIndex's own embedding events for the texts Teola's embedder engine embeds.

Plain ``BaseEmbedding.get_query_embedding`` (once per query string) and
``get_text_embedding_batch`` (once per ``embed_batch_size`` texts of each insert batch of
``VectorStoreIndex._add_nodes_to_index``) report every call: the callback manager's
``EMBEDDING`` event, whose ``CHUNKS`` ``TokenCountingHandler`` counts as embedding tokens and
``LlamaDebugHandler`` lists, and the dispatcher's ``EmbeddingStartEvent`` /
``EmbeddingEndEvent``, which instrumentation handlers (Langfuse, Phoenix) read. Texts the
embedder engine embeds — a lowered retrieval's query strings, a fusion's generated queries,
a deferred ingestion's nodes joined into a query or flushed — never run those methods, so
:class:`EmbedEvents` reports them once their vectors are back, in the batches plain makes
(a start and its end together: the events' timing is not the engine's). Only when someone
listens. A served embedding model's own ``get_query_embedding`` runs and reports itself.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llama_index.core.base.embeddings import base as embeddings_base
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.events.embedding import EmbeddingEndEvent, EmbeddingStartEvent

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from .llama_index import framework_call
from .llama_index_listening import has_handlers, listened, model_dict
from .llama_index_spans import instant_span, running_async


@dataclass(frozen=True)
class EmbedEvents:
    """The events of ``embed_model``'s embedding calls that Teola ran on its engine."""

    embed_model: Any

    @classmethod
    def of(cls, embed_model: Any) -> EmbedEvents | None:
        """None when nobody listens (then nothing is reported, nor added to a graph): to its
        events, or to the spans a query's embedding opens (a span handler alone)."""
        dispatcher = embeddings_base.dispatcher
        heard = listened(embed_model, dispatcher) or has_handlers(dispatcher, "span_handlers")
        return cls(embed_model) if heard else None

    def report(self, texts: Sequence[str], vectors: Sequence[Any], sizes: Iterable[int] | None = None,
               async_: bool | None = None) -> None:
        """One embedding call per batch of ``sizes`` texts (None: one per text, as queries are);
        ``async_``: whether plain awaits a query's embedding (None: as the running primitive's call)."""
        model = self.embed_model
        async_ = running_async() if async_ is None else async_
        described = model_dict(model)
        start = 0
        for size in sizes if sizes is not None else [1] * len(texts):
            # as the model returns them: lists of Python floats (the engine's float32 values, exactly)
            chunks = list(texts[start:start + size])
            embeddings = [np.asarray(v).tolist() for v in vectors[start:start + size]]
            start += size
            # a query string's events in the span of its ``get_query_embedding``
            # (``aget_query_embedding``), around the model's own, which ran on the engine
            query = sizes is None
            outer = ("aget_query_embedding" if async_ else "get_query_embedding") if query else None
            vector = embeddings[0] if query else None  # what get_query_embedding returns
            with (instant_span(model, outer, args=lambda v: {"query": chunks[0]}, result=vector) if outer
                  else contextlib.nullcontext()):
                embeddings_base.dispatcher.event(EmbeddingStartEvent(model_dict=described))
                with model.callback_manager.event(CBEventType.EMBEDDING,
                                                  payload={EventPayload.SERIALIZED: described}) as event:
                    if query:
                        self._model_spans(chunks[0], vector, async_)
                    event.on_end(payload={EventPayload.CHUNKS: chunks, EventPayload.EMBEDDINGS: embeddings})
                embeddings_base.dispatcher.event(EmbeddingEndEvent(chunks=chunks, embeddings=embeddings))

    def _model_spans(self, query: str, vector: list[float], async_: bool) -> None:
        """The model's own ``_get_query_embedding`` span (async: ``_aget_query_embedding``'s,
        around the sync one's where it calls it, as HuggingFaceEmbedding's does), returning ``vector``."""
        model = self.embed_model
        args = lambda v: {"query": query}  # noqa: E731
        if not async_:
            with instant_span(model, "_get_query_embedding", args=args, result=vector):
                return
        own = inspect.unwrap(getattr(type(model), "_aget_query_embedding"))
        with instant_span(model, "_aget_query_embedding", args=args, result=vector):
            if "_get_query_embedding" in getattr(getattr(own, "__code__", None), "co_names", ()):
                with instant_span(model, "_get_query_embedding", args=args, result=vector):
                    pass

    def add_step(self, graph: PGraph, texts: Ref, vectors: Ref, origin: str, query: Ref | None = None,
                 sizes: Sequence[int] | None = None) -> Ref:
        """A step after the embedding that reports it; with ``query``, only when plain embeds it
        (a query bundle that brings its own embedding embeds nothing). Its output is the
        vectors once reported: what reads them there comes after the embedding's events, as
        after plain's ``get_query_embedding``."""
        def embedded(texts: Sequence[str], vectors: Sequence[Any], query: Any = None) -> Sequence[Any]:
            if query is None or getattr(query, "embedding", None) is None:
                self.report(texts, vectors, sizes)
            return vectors

        embedded.__qualname__ = f"embed_events[{type(self.embed_model).__name__}]"
        inputs = {"texts": texts, "vectors": vectors, **({"query": query} if query is not None else {})}
        return graph.add(Op.OPAQUE, name=graph.unique_name("embed_events"), inputs=inputs, origin=origin,
                         attrs={"fn": framework_call(embedded), "pure": False}).out()


def insert_batches(batch_sizes: Iterable[int], insert_batch_size: int, embed_batch_size: int) -> list[int]:
    """The embedding calls plain makes for nodes added in calls of ``batch_sizes`` nodes:
    ``_add_nodes_to_index`` cuts each call's nodes into insert batches, and
    ``get_text_embedding_batch`` each insert batch into ``embed_batch_size`` texts."""
    out = []
    for n in batch_sizes:
        for first in range(0, n, insert_batch_size):
            left = min(insert_batch_size, n - first)
            out += [min(embed_batch_size, left - k) for k in range(0, left, embed_batch_size)]
    return out
