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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...served_models import installed_classes
from ..tracer import NotLowerable

# the retriever's search_kwargs every store's search by vector takes as its text search does
COMMON_KWARGS = {"similarity": frozenset({"k", "filter"}), "mmr": frozenset({"k", "fetch_k", "lambda_mult", "filter"})}
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

    @property
    def class_name(self) -> str:
        return self.path.partition(":")[2]

    def search_kwargs(self, search_type: str) -> frozenset[str]:
        return COMMON_KWARGS[search_type] | self.extra_kwargs.get(search_type, frozenset())


STORES = (
    SearchableStore("langchain_core.vectorstores:InMemoryVectorStore", lambda store: store.embedding),
    SearchableStore("langchain_chroma:Chroma", lambda store: store.embeddings,
                    {"similarity": frozenset({"where_document"}), "mmr": frozenset({"where_document"})}),
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
