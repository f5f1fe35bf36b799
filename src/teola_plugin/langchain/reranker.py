"""``TeolaReranker``: a LangChain document compressor on Teola's reranker engine.

    compressor = TeolaReranker(top_n=3)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)

Usable on its own (``compress_documents``), like any ``BaseDocumentCompressor``; inside a
``TeolaRunnable`` the compression retriever is lowered to ``rerank`` on the same engine,
batched with other queries' reranks. Both paths return the same documents (copies, in the
new order, with ``metadata["relevance_score"]``).

The scorer is whatever the runtime's ``reranker`` engine loads (``engines/reranker.py``).
By default that is the bundled all-MiniLM-L6-v2 *bi-encoder* (cosine similarity of query
and passage embeddings): the only reranking model available offline here. Configure the
engine with ``cross_encoder_path=`` for a real cross-encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field

from ..capture.langchain.documents import documents_to_hits, hits_to_documents
from ..runtime.app_runs import call_priority
from ..runtime.runtime import Runtime, default_runtime
from ..runtime.bridge import started_pool


class TeolaReranker(BaseDocumentCompressor):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    runtime: Any = Field(default=None, exclude=True)
    """The Teola ``Runtime`` whose engines serve this reranker; default: ``default_runtime()``."""
    engine: str = "reranker"
    top_n: int | None = 3
    """How many documents to keep (None: all, reordered)."""

    def teola_runtime(self) -> Runtime:
        return self.runtime if self.runtime is not None else default_runtime()

    def teola_reranker_engine(self) -> str:
        return self.engine

    async def _rerank(self, documents: list[Document], query: str) -> list[Document]:
        if not documents:
            return []
        pool = await started_pool(self.teola_runtime(), self.engine)
        hits, _ = await pool.submit("rerank", {"query": query, "hits": documents_to_hits(documents),
                                               "top_n": self.top_n}, call_priority())
        return hits_to_documents(documents, hits)

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        return self.teola_runtime().run_sync(self._rerank(list(documents), query))

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        return await self.teola_runtime().run_async(self._rerank(list(documents), query))
