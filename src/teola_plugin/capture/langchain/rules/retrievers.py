"""Retrievers over the user's own vector store: embed -> vector_search on that store.

The store stays the user's object: the plan serves it as an engine (its own similarity
search by vector, exactly what the retriever calls after embedding the query), so the
documents come back as the store returns them. Lowered only where that equivalence is
known: ``InMemoryVectorStore`` or ``langchain_chroma.Chroma`` (whose ``similarity_search``
is ``embed_query`` then its search by vector) with embeddings computed by a Teola engine.
Composite retrievers (multi-query, ensemble, contextual compression) are in
``composite_retrievers.py``.
"""

from __future__ import annotations

from typing import Any

from langchain_core.vectorstores import InMemoryVectorStore, VectorStoreRetriever

from ....ir.node import Ref
from ....ir.ops import Op
from ..protocols import LowerableEmbeddings
from ..tracer import CannotLower, LangChainTracer, component_name, lowering
from ..values import Kind, Traced, Value


def check_vector_retriever(retriever: Any) -> None:
    """Raise CannotLower unless ``retriever`` is a similarity search we can reproduce."""
    if not isinstance(retriever, VectorStoreRetriever):
        raise CannotLower(f"inner retriever {type(retriever).__name__} is not a VectorStoreRetriever")
    if retriever.search_type != "similarity":
        raise CannotLower(f"search_type {retriever.search_type!r} (only 'similarity' is lowered)")
    extra = sorted(set(retriever.search_kwargs) - {"k"})
    if extra:
        raise CannotLower(f"search_kwargs {extra} (only 'k' is lowered)")
    store = retriever.vectorstore
    if type(store) not in searchable_stores():
        raise CannotLower(f"vector store {type(store).__name__} (lowered: InMemoryVectorStore, Chroma)")
    if not isinstance(store_embeddings(store), LowerableEmbeddings):
        raise CannotLower("the store's embeddings do not run on a Teola engine (use TeolaEmbeddings)")


def searchable_stores() -> set[type]:
    """Stores whose text search is exactly ``embed_query`` + ``similarity_search_by_vector``."""
    stores: set[type] = {InMemoryVectorStore}
    try:
        from langchain_chroma import Chroma
        stores.add(Chroma)
    except ImportError:  # langchain-chroma is optional
        pass
    return stores


def store_embeddings(store: Any) -> Any:
    return store.embedding if isinstance(store, InMemoryVectorStore) else store.embeddings


def search_lists(t: LangChainTracer, retriever: VectorStoreRetriever, queries: Ref, n_queries: int) -> Ref:
    """embed(queries) -> vector_search on the user's store: one document list per query."""
    origin = component_name(retriever)
    store = retriever.vectorstore
    index, engine = t.store_input(store)
    embed = t.add(Op.EMBED, name="embed", engine=store_embeddings(store).teola_embedder_engine(),
                  inputs={"texts": queries}, attrs={"est_items": n_queries}, origin=origin)
    search = t.add(Op.VECTOR_SEARCH, name="vector_search", engine=engine,
                   inputs={"index": index, "vectors": embed.out()},
                   attrs={"top_k": int(retriever.search_kwargs.get("k", 4)), "est_items": n_queries},
                   origin=origin)
    return search.out()


@lowering(VectorStoreRetriever)
def lower_vector_retriever(t: LangChainTracer, retriever: VectorStoreRetriever, value: Value) -> Value:
    check_vector_retriever(retriever)
    origin = component_name(retriever)
    query = t.materialise(value)
    batch = t.add(Op.AGGREGATE, name="query_list", inputs={"in0": query}, attrs={"mode": "list"}, origin=origin)
    lists = search_lists(t, retriever, batch.out(), 1)
    pick = t.add(Op.AGGREGATE, name="documents", inputs={"in0": lists},
                 attrs={"mode": "pick", "index": 0}, origin=origin)
    return Traced(pick.out(), Kind.DOCUMENTS)
