"""LangChain documents <-> the reranker engine's hits, one conversion for both paths.

A ``TeolaReranker`` called directly and its lowered ``rerank`` primitive use these same two
functions, so both return the same documents: the input documents (copies; the caller's
are not modified) in the reranked order, each with its score in ``metadata["relevance_score"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document


def documents_to_hits(docs: Sequence[Document]) -> list[dict[str, Any]]:
    """Hits for the reranker engine; a hit's id is the document's position."""
    return [{"id": str(i), "text": d.page_content} for i, d in enumerate(docs)]


def hits_to_documents(docs: Sequence[Document], hits: Sequence[Any]) -> list[Document]:
    out = []
    for hit in hits:
        doc = docs[int(hit.id)]
        out.append(Document(page_content=doc.page_content, id=doc.id,
                            metadata={**doc.metadata, "relevance_score": float(hit.score)}))
    return out
