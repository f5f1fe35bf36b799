"""``EmbeddingsFilter`` (LangChain's contextual-compression docs) with its embeddings on an engine.

``EmbeddingsFilter.compress_documents`` embeds the documents (``embed_documents``) and the
query (``embed_query``), then keeps the documents whose cosine similarity passes its ``k`` /
``similarity_threshold``. Lowered: both embeddings are ``embed`` primitives on the engine
that computes the model's vectors (the embedder, for ``TeolaEmbeddings`` and
``HuggingFaceEmbeddings`` of its model), and the filter's own ``compress_documents`` then runs
on those vectors (:class:`ComputedEmbeddings` hands them back for exactly those texts), so its
selection, order and ``query_similarity_score`` states are its own. Any other embeddings
(a served model, which batches documents its own way; a model whose query and document encode
arguments differ) leaves the compressor to run as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings

from ....ir.node import Ref
from ....ir.ops import Op
from ...served_models import installed_classes
from ..tracer import OUT, LangChainTracer, component_name
from .retrievers import embedded_texts, embedding_call, is_huggingface_embeddings


class ComputedEmbeddings(Embeddings):
    """The vectors an engine computed for ``texts`` and ``query``, as the model's own methods
    return them; any other text is the model's own call."""

    def __init__(self, model: Any, texts: Sequence[str], vectors: Sequence[Any], query: str, query_vector: Any) -> None:
        self.model, self.texts, self.query = model, list(texts), query
        self.vectors = [[float(x) for x in v] for v in vectors]
        self.query_vector = [float(x) for x in query_vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.vectors if list(texts) == self.texts else self.model.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        return self.query_vector if text == self.query else self.model.embed_query(text)


def is_embeddings_filter(compressor: Any) -> bool:
    return type(compressor).__name__ == "EmbeddingsFilter" and type(compressor) in installed_classes(
        "langchain_classic.retrievers.document_compressors:EmbeddingsFilter")


def lower_embeddings_filter(t: LangChainTracer, compressor: Any, docs: Ref, query: Ref) -> Ref | None:
    """documents -> their texts -> ``embed``; query -> ``embed``; then the filter's own
    ``compress_documents`` on those vectors. None when its embeddings do not run on an engine
    the same way for documents and queries (then it runs as it is)."""
    model = compressor.embeddings
    embedding = embedding_call(t, model)
    if embedding.engine is None or embedding.embed_text is not None:  # its own code, or a served model's
        return None
    if is_huggingface_embeddings(model) and (getattr(model, "query_encode_kwargs", None) or model.encode_kwargs) \
            != model.encode_kwargs:  # documents and queries encoded differently: one engine call cannot be both
        return None
    origin = component_name(compressor)

    async def texts_of(docs: list[Any]) -> list[str]:
        return [d.page_content for d in docs]

    texts = t.add(Op.OPAQUE, name="document_texts", inputs={"docs": docs}, outputs=[OUT], origin=origin,
                  attrs={"fn": texts_of, "pure": True}).out(OUT)
    doc_vectors = embedded_texts(t, embedding, texts, 8, origin)
    queries = t.add(Op.AGGREGATE, name="query_list", inputs={"in0": query}, attrs={"mode": "list"}, origin=origin)
    query_vector = embedded_texts(t, embedding, queries.out(), 1, origin)

    async def compress(docs: list[Any], query: str, doc_vectors: Any, query_vectors: Any) -> list[Any]:
        if not docs:  # as ContextualCompressionRetriever: no call on no documents
            return []
        given = ComputedEmbeddings(model, [d.page_content for d in docs], doc_vectors, query, query_vectors[0])
        return list(compressor.model_copy(update={"embeddings": given}).compress_documents(docs, query))

    return t.add(Op.OPAQUE, name="compress", outputs=[OUT], origin=origin, attrs={"fn": compress},
                 inputs={"docs": docs, "query": query, "doc_vectors": doc_vectors,
                         "query_vectors": query_vector}).out(OUT)
