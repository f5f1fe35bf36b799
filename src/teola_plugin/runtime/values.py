"""Values that flow between primitives at run time (the IR only names their port types)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngineInputError


@dataclass(frozen=True)
class Document:
    """A DOCS item: a document or a chunk of one. ``source`` keeps the framework's own object
    (a LlamaIndex node, a LangChain Document) so results convert back without loss."""

    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class IndexHandle:
    """An INDEX value: the vector-store index that an insert wrote into."""

    name: str
    dim: int = 0


@dataclass(frozen=True)
class StoreSearch:
    """How a user's own store is searched by vector: its ``method`` (LangChain:
    ``similarity_search_by_vector``, ``max_marginal_relevance_search_by_vector``) with the
    retriever's ``kwargs`` (``k``, a ``filter``, MMR's ``fetch_k`` / ``lambda_mult``), exactly
    as its text search calls it after embedding the query. Where the framework's text search
    does more than one store call, ``function(store, vector, **kwargs)`` reproduces it
    (``method`` then names what it reproduces)."""

    method: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    function: Callable[..., list[Any]] | None = None


@dataclass
class LLMState:
    """An LLM_STATE value: a generation whose prefill is done (an open engine stream)."""

    engine: str
    stream_id: str
    first: list[Any]
    finished: bool
    consumed: bool = False


def as_document(obj: Any, index: int = 0) -> Document:
    """Accept our Document, LlamaIndex nodes, LangChain Documents, dicts or plain strings."""
    if isinstance(obj, Document):
        return obj
    if isinstance(obj, str):
        return Document(id=f"doc-{index}", text=obj)
    if isinstance(obj, Mapping) and "text" in obj:
        return Document(id=str(obj.get("id", f"doc-{index}")), text=str(obj["text"]),
                        metadata=dict(obj.get("metadata") or {}), source=obj)
    if hasattr(obj, "get_content") and hasattr(obj, "node_id"):  # LlamaIndex BaseNode
        return Document(id=obj.node_id, text=obj.get_content(), metadata=dict(obj.metadata or {}), source=obj)
    if hasattr(obj, "page_content"):  # LangChain Document
        return Document(id=str(getattr(obj, "id", None) or f"doc-{index}"), text=obj.page_content,
                        metadata=dict(obj.metadata or {}), source=obj)
    raise EngineInputError(f"document {index} has unsupported type {type(obj).__name__}; "
                           f"pass str, dict with 'text', or a framework document")
