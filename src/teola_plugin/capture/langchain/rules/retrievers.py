"""Retrievers over the user's own vector store: embed -> vector_search on that store.

The store stays the user's object: the plan serves it as an engine (its own search by
vector, similarity or MMR with the retriever's ``k`` and ``filter``: exactly what the
retriever's text search calls after embedding the query; for ``similarity_score_threshold``
the store's relevance function and scored search by vector, then the threshold), so the
documents come back as the store returns them. Lowered only where that equivalence is
known: the stores of ``stores.py`` (``InMemoryVectorStore``, Chroma, FAISS, Qdrant, Milvus), whose
``similarity_search`` is ``embed_query`` then its search by vector. The query embedding is its own primitive:
an ``embed`` on the embedder engine for ``TeolaEmbeddings`` and ``HuggingFaceEmbeddings``
(langchain-huggingface, or the community one) of the embedder engine's model loaded the
same way (``capture/embedder_identity.py``); an ``embed`` on the served engine of its server
for ``OpenAIEmbeddings`` (``capture/served_embeddings.py``: the model's own ``embed_query``,
its requests sent by the engine); any other embeddings class runs its own ``embed_query``
as an opaque step, and the search stays lowered.
Composite retrievers (multi-query, ensemble, contextual compression) are in
``composite_retrievers.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStoreRetriever

from ....ir.node import Ref
from ....ir.ops import Op
from ....runtime.values import StoreSearch
from ...embedder_identity import huggingface_embeddings_serving, newlines_to_spaces
from ...lowerable import LowerableEmbedding
from ...served_embeddings import embedding_endpoint, is_served_embedding
from ..tracer import NotLowerable, LangChainTracer, component_name, lowering
from ..values import Kind, Traced, Value
from .callbacks import retriever_reporters
from .stores import search_with_relevance_scores, searchable_store


@dataclass(frozen=True)
class EmbeddingCall:
    """How a store's query embeddings run: an ``embed`` primitive on ``engine``, after the
    model's own text preparation (``prepare(text) -> text``; None: the text as it is), or
    the model's own ``embed_query`` per text (``embed_text``: on a served ``engine``, or with
    no engine as an opaque step, for ``opaque_because``)."""

    engine: str | None
    prepare: Callable[[str], str] | None = None
    embed_text: Callable[[str], list[float]] | None = None
    model: Any = None
    opaque_because: str = ""


def embedding_call(t: LangChainTracer, embeddings: Any) -> EmbeddingCall:
    """How ``embeddings.embed_query`` runs in a lowered retriever."""
    if isinstance(embeddings, LowerableEmbedding):
        return EmbeddingCall(embeddings.teola_embedder_engine())
    if is_huggingface_embeddings(embeddings):
        try:
            return huggingface_call(t, embeddings)
        except NotLowerable as why:
            return own_embedding(embeddings, str(why))
    if is_served_embedding(embeddings):
        try:
            engine = t.engines.served_engine(embedding_endpoint(embeddings))
        except NotLowerable as why:
            return own_embedding(embeddings, str(why))
        return EmbeddingCall(engine, embed_text=embeddings.embed_query, model=embeddings)
    return own_embedding(embeddings, f"{type(embeddings).__name__} does not run on a Teola engine "
                                     "(TeolaEmbeddings, HuggingFaceEmbeddings of the embedder's model and "
                                     "OpenAIEmbeddings of a model server do)")


def own_embedding(embeddings: Any, why: str) -> EmbeddingCall:
    """The model's own ``embed_query``, as an opaque step of the lowered retriever."""
    return EmbeddingCall(None, embed_text=embeddings.embed_query, model=embeddings, opaque_because=why)


def is_huggingface_embeddings(embeddings: Any) -> bool:
    """langchain-huggingface's ``HuggingFaceEmbeddings`` or the community one it replaced."""
    module = type(embeddings).__module__
    return type(embeddings).__name__ == "HuggingFaceEmbeddings" and module.startswith(
        ("langchain_huggingface.", "langchain_community.embeddings"))


def huggingface_call(t: LangChainTracer, embeddings: Any) -> EmbeddingCall:
    """``HuggingFaceEmbeddings.embed_query``: newlines to spaces, then its sentence-transformers
    client's ``encode`` with ``query_encode_kwargs`` (if any; langchain-huggingface) or
    ``encode_kwargs``."""
    field = "query_encode_kwargs" if getattr(embeddings, "query_encode_kwargs", None) else "encode_kwargs"
    engine, why = huggingface_embeddings_serving(t.planner.engine_specs(), embeddings, getattr(embeddings, field),
                                                 field)
    if engine is None:
        raise NotLowerable(why)
    return EmbeddingCall(engine, newlines_to_spaces)


# search_type -> the store's method by vector that its text search calls after embed_query
# (a relevance-score search: several calls, made by stores.search_with_relevance_scores)
BY_VECTOR = {"similarity": "similarity_search_by_vector", "mmr": "max_marginal_relevance_search_by_vector",
             "similarity_score_threshold": "similarity_search_with_relevance_scores"}


def check_vector_retriever(t: LangChainTracer, retriever: Any) -> EmbeddingCall:
    """How ``retriever``'s query embedding runs; NotLowerable unless ``retriever`` is a
    similarity, MMR or relevance-score search we can reproduce (on a store of ``stores.py``)."""
    if not isinstance(retriever, VectorStoreRetriever):
        raise NotLowerable(f"inner retriever {type(retriever).__name__} is not a VectorStoreRetriever")
    if retriever.search_type not in BY_VECTOR:
        raise NotLowerable(f"search_type {retriever.search_type!r} (lowered: {', '.join(map(repr, BY_VECTOR))})")
    store = searchable_store(retriever.vectorstore)
    allowed = store.search_kwargs(retriever.search_type)
    extra = sorted(set(retriever.search_kwargs) - allowed)
    if extra:
        raise NotLowerable(f"search_kwargs {extra} (lowered: {', '.join(sorted(allowed))})")
    embeddings = store.embeddings(retriever.vectorstore)
    if embeddings is None:
        raise NotLowerable(f"{store.class_name} without embeddings (its own embedding of the query text)")
    if not isinstance(embeddings, Embeddings) and callable(embeddings):  # FAISS built with a function
        return EmbeddingCall(None, embed_text=embeddings, model=embeddings,
                             opaque_because="the store embeds queries with a function")
    return embedding_call(t, embeddings)


def store_search(retriever: VectorStoreRetriever) -> StoreSearch:
    """The store's own search by vector, with the retriever's arguments (``k`` 4 by default)."""
    kwargs = {"k": 4, **retriever.search_kwargs}
    if retriever.search_type != "similarity_score_threshold":
        return StoreSearch(BY_VECTOR[retriever.search_type], kwargs)
    scored = searchable_store(retriever.vectorstore).with_score_by_vector
    return StoreSearch(BY_VECTOR[retriever.search_type], {**kwargs, "with_score_by_vector": scored},
                       search_with_relevance_scores)


def search_lists(t: LangChainTracer, retriever: VectorStoreRetriever, embedding: EmbeddingCall, queries: Ref,
                 n_queries: int) -> Ref:
    """embed(queries) -> vector_search on the user's store: one document list per query."""
    origin = component_name(retriever)
    store = retriever.vectorstore
    index, engine = t.store_input(store)
    vectors = embedded_texts(t, embedding, queries, n_queries, origin)
    how = store_search(retriever)
    search = t.add(Op.VECTOR_SEARCH, name="vector_search", engine=engine,
                   inputs={"index": index, "vectors": vectors},
                   attrs={"top_k": int(how.kwargs["k"]), "store_search": how, "est_items": n_queries},
                   origin=origin)
    return search.out()


def embedded_texts(t: LangChainTracer, embedding: EmbeddingCall, texts: Ref, n_texts: int, origin: str) -> Ref:
    """One vector per text, after the model's own text preparation (if any)."""
    if embedding.prepare is not None:
        prepare = embedding.prepare

        async def prepared(texts: list[str]) -> list[str]:
            return [prepare(text) for text in texts]

        texts = t.add(Op.OPAQUE, name="prepare_texts", inputs={"texts": texts}, outputs=["out"],
                      attrs={"fn": prepared, "pure": True}, origin=origin).out("out")
    return query_vectors(t, embedding, texts, n_texts, origin)


def query_vectors(t: LangChainTracer, embedding: EmbeddingCall, queries: Ref, n_queries: int, origin: str) -> Ref:
    """One vector per query text, as ``embedding`` says they are computed."""
    if embedding.engine is not None:
        own = {"embed_text": embedding.embed_text} if embedding.embed_text is not None else {}
        return t.add(Op.EMBED, name="embed", engine=embedding.engine, inputs={"texts": queries},
                     attrs={"est_items": n_queries, **own}, origin=origin).out()
    embed_text = embedding.embed_text

    def embed_queries(texts: list[str]) -> list[list[float]]:
        return [embed_text(text) for text in texts]  # type: ignore[misc]

    prim = t.add(Op.OPAQUE, name="embed_query", inputs={"texts": queries}, outputs=["vectors"],
                 attrs={"fn": embed_queries, "pure": True}, origin=component_name(embedding.model))
    t.note_opaque(embedding.model, prim.name, embedding.opaque_because)
    return prim.out("vectors")


def reported_search(t: LangChainTracer, retriever: Any, search: VectorStoreRetriever, embedding: EmbeddingCall,
                    value: Value, documents: Callable[[Ref], Ref]) -> Value:
    """One query's search of ``search``'s store inside ``retriever``'s own run, as
    ``BaseRetriever.invoke`` reports it: retriever_start -> embed -> vector_search ->
    ``documents(lists)`` (what the retriever returns, from the search's one list) ->
    retriever_end; if the search fails, the graph run's run tree errors the run it opened."""
    origin = component_name(retriever)
    query = t.materialise(value)
    report_start, report_end = retriever_reporters(retriever, t.step_tag_of(retriever), t.bound_config_of(retriever))
    started = t.graph.add(Op.OPAQUE, name=t.graph.unique_name("retriever_start"), inputs={"query": query},
                          outputs=["run"], attrs={"fn": report_start, "opens_run": True}, origin=origin)
    batch = t.add(Op.AGGREGATE, name="query_list", inputs={"in0": query}, attrs={"mode": "list"}, origin=origin)
    lists = search_lists(t, search, embedding, batch.out(), 1)
    ended = t.add(Op.OPAQUE, name="retriever_end", inputs={"run": started.out("run"), "documents": documents(lists)},
                  attrs={"fn": report_end}, origin=origin)
    return Traced(ended.out(), Kind.DOCUMENTS)


@lowering(VectorStoreRetriever)
def lower_vector_retriever(t: LangChainTracer, retriever: VectorStoreRetriever, value: Value) -> Value:
    embedding = check_vector_retriever(t, retriever)

    def first_list(lists: Ref) -> Ref:
        return t.add(Op.AGGREGATE, name="documents", inputs={"in0": lists}, attrs={"mode": "pick", "index": 0},
                     origin=component_name(retriever)).out()

    return reported_search(t, retriever, retriever, embedding, value, first_list)
