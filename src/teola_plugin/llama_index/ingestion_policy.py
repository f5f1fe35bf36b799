"""Which ``VectorStoreIndex`` ingestion the executor may defer, and why.

Deferring ``_add_nodes_to_index`` into the next query's graph lets the upload's embedding
overlap the query's own work, but until a query (or the idle flush) stores them the nodes
live only in this process. That costs nothing only where plain LlamaIndex keeps them in this
process too: every store the call writes is LlamaIndex's in-memory one (``SimpleVectorStore``,
``SimpleDocumentStore``, ``SimpleIndexStore``: written to disk only by an explicit
``persist()``, which stores pending nodes first), so a crash loses the index in plain as well.
Any other store — persistent or server Chroma, any vector store Teola does not know to be
private memory, a docstore or index store over a database — is written before
``from_documents`` / ``insert`` returns, as plain LlamaIndex writes it; the embedding still
runs on the embedder engine (batched with running queries) when an engine serves the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IngestionPath:
    """How one index's documents are stored under the executor (explain() prints it)."""

    deferred: bool
    reason: str

    def __str__(self) -> str:
        how = "deferred into the next query's graph" if self.deferred else "stored before insert returns"
        return f"{how}: {self.reason}"


def _private_memory_types() -> tuple[type, ...]:
    from llama_index.core.storage.docstore import SimpleDocumentStore
    from llama_index.core.storage.index_store import SimpleIndexStore
    from llama_index.core.vector_stores import SimpleVectorStore

    return SimpleVectorStore, SimpleDocumentStore, SimpleIndexStore


def ingestion_path(index: Any, defer: bool, served: bool) -> IngestionPath:
    """The path for ``index`` given the executor's ``defer_ingestion`` and whether an engine
    serves its embed model. Exact types only: a subclass may write elsewhere as it adds."""
    if not served:
        from ..capture.served_embeddings import is_served_embedding

        model = type(index._embed_model).__name__
        if is_served_embedding(index._embed_model):  # its batches are its own requests: not re-cut per node
            return IngestionPath(False, f"{model} embeds the nodes with its own batched requests, "
                                        "sent by the served engine of its server")
        return IngestionPath(False, f"no Teola engine serves {model}: LlamaIndex's own embedding code runs")
    if not defer:
        return IngestionPath(False, "defer_ingestion=False")
    vector, docs, structs = _private_memory_types()
    storage = index._storage_context
    stores = {"vector store": (index._vector_store, vector), "docstore": (storage.docstore, docs),
              "index store": (storage.index_store, structs)}
    durable = [f"{role} {type(store).__name__}" for role, (store, private) in stores.items()
               if type(store) is not private]
    if durable:
        return IngestionPath(False, f"{', '.join(durable)} may be durable or shared, so it is written "
                                    "when the call returns, as plain LlamaIndex writes it")
    return IngestionPath(True, "every store is LlamaIndex's in-memory one (a crash loses it in plain "
                               "LlamaIndex too); stored by the next query, a read, persist() or the idle flush")
