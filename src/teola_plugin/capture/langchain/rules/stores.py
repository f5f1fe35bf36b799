"""The LangChain vector stores a lowered retriever searches in place.

A store qualifies when its text search is exactly "embed the query with its embeddings'
``embed_query``, then its own search by vector with the same arguments" — so the lowered
graph (``embed`` -> ``vector_search`` calling that search by vector on the user's store)
returns the store's documents. Checked in each class's source:

* ``InMemoryVectorStore`` (langchain-core), ``Chroma`` (langchain-chroma; also passes
  ``where_document`` on), ``FAISS`` (langchain-community; its ``_embed_query`` calls the
  embeddings' ``embed_query``, or the function it was built with; ``fetch_k`` and
  ``score_threshold`` passed on), ``QdrantVectorStore`` (langchain-qdrant, dense retrieval
  mode: the sparse and hybrid modes embed the query with a sparse model too), ``Milvus``
  (langchain-milvus, Milvus Lite or a server; one vector field with one embedding model and
  no built-in function: otherwise it searches several fields or embeds the text itself).

A ``similarity_score_threshold`` retriever's text search is several store calls (the
relevance function, the scored search, the threshold): :func:`search_with_relevance_scores`
makes them, after the query's embedding, with each store's scored search by vector
(``with_score_by_vector``: what its ``similarity_search_with_score`` calls after
``embed_query``, checked in each class's source).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...served_models import installed_classes
from ..tracer import NotLowerable

# the retriever's search_kwargs every store's search by vector takes as its text search does
COMMON_KWARGS = {"similarity": frozenset({"k", "filter"}), "mmr": frozenset({"k", "fetch_k", "lambda_mult", "filter"}),
                 "similarity_score_threshold": frozenset({"k", "filter", "score_threshold"})}
_QDRANT_OPTIONS = frozenset({"search_params", "score_threshold", "consistency"})
_MILVUS_OPTIONS = frozenset({"param", "expr", "timeout"})


def _qdrant_dense(store: Any) -> str:
    mode = getattr(store.retrieval_mode, "value", store.retrieval_mode)
    return "" if mode == "dense" else f"retrieval_mode {mode!r} (lowered: dense)"


def _milvus_single_vector(store: Any) -> str:
    if store._is_multi_vector or store._as_list(store.builtin_func) or len(store._as_list(store.embedding_func)) != 1:
        return "several vector fields or a built-in function (its search is not one embedding's)"
    return ""


@dataclass(frozen=True)
class SearchableStore:
    """A store class whose text search is its embeddings' ``embed_query``, then its search by vector."""

    path: str  # "module:Class"
    embeddings: Callable[[Any], Any]  # the store's query embeddings (an Embeddings, or FAISS's function)
    extra_kwargs: Mapping[str, frozenset[str]] = field(default_factory=dict)  # per search type
    declines: Callable[[Any], str] = lambda store: ""  # why this instance does not qualify ("" if it does)
    # its search by vector that returns what its similarity_search_with_score does after embed_query
    with_score_by_vector: str = "similarity_search_with_score_by_vector"

    @property
    def class_name(self) -> str:
        return self.path.partition(":")[2]

    def search_kwargs(self, search_type: str) -> frozenset[str]:
        # a relevance-score search passes its other kwargs to the store's similarity search
        own = "similarity" if search_type == "similarity_score_threshold" else search_type
        return COMMON_KWARGS[search_type] | self.extra_kwargs.get(own, frozenset())


STORES = (
    SearchableStore("langchain_core.vectorstores:InMemoryVectorStore", lambda store: store.embedding),
    SearchableStore("langchain_chroma:Chroma", lambda store: store.embeddings,
                    {"similarity": frozenset({"where_document"}), "mmr": frozenset({"where_document"})},
                    with_score_by_vector="similarity_search_by_vector_with_relevance_scores"),  # distances, too
    SearchableStore("langchain_community.vectorstores:FAISS", lambda store: store.embedding_function,
                    {"similarity": frozenset({"fetch_k", "score_threshold"})}),
    SearchableStore("langchain_qdrant:QdrantVectorStore", lambda store: store.embeddings,
                    {"similarity": _QDRANT_OPTIONS | {"offset"}, "mmr": _QDRANT_OPTIONS}, _qdrant_dense),
    SearchableStore("langchain_milvus:Milvus", lambda store: store.embeddings,
                    {"similarity": _MILVUS_OPTIONS, "mmr": _MILVUS_OPTIONS}, _milvus_single_vector),
)


def searchable_store(store: Any) -> SearchableStore:
    """How ``store`` is searched in place; NotLowerable when it is not."""
    for known in STORES:
        # the name first: no import of a store package the app does not use
        if type(store).__name__ == known.class_name and type(store) in installed_classes(known.path):
            why = known.declines(store)
            if why:
                raise NotLowerable(f"{known.class_name} with {why}")
            return known
    raise NotLowerable(f"vector store {type(store).__name__} "
                       f"(lowered: {', '.join(s.class_name for s in STORES)})")


def search_with_relevance_scores(store: Any, embedding: list[float], *, with_score_by_vector: str,
                                 k: int = 4, **kwargs: Any) -> list[Any]:
    """A ``similarity_score_threshold`` retriever's search after ``embed_query``: LangChain's
    ``VectorStore.similarity_search_with_relevance_scores`` (and FAISS's own
    ``_similarity_search_with_relevance_scores``, the same steps): the store's relevance
    function, chosen before the search (plain's error if it has none), applied to its scored
    search by vector; the out-of-range warning, the threshold and its log line; the documents."""
    score_threshold = kwargs.pop("score_threshold", None)
    relevance_score_fn = store._select_relevance_score_fn()
    docs_and_scores = getattr(store, with_score_by_vector)(embedding, k, **kwargs)
    docs_and_similarities = [(doc, relevance_score_fn(score)) for doc, score in docs_and_scores]
    if any(similarity < 0.0 or similarity > 1.0 for _, similarity in docs_and_similarities):
        warnings.warn(f"Relevance scores must be between 0 and 1, got {docs_and_similarities}", stacklevel=2)
    if score_threshold is not None:
        docs_and_similarities = [(doc, s) for doc, s in docs_and_similarities if s >= score_threshold]
        if not docs_and_similarities:
            logging.getLogger("langchain_core.vectorstores.base").warning(
                "No relevant docs were retrieved using the relevance score threshold %s", score_threshold)
    return [doc for doc, _ in docs_and_similarities]
