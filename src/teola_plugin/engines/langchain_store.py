"""Serve a LangChain vector store object as a Teola engine (kind ``vector_store``).

The store stays the user's instance: a lowered retriever's ``vector_search`` primitive
calls the store's own search by vector with the query vector and the retriever's arguments
(``StoreSearch``: ``similarity_search_by_vector``, or ``max_marginal_relevance_search_by_vector``
for MMR; ``k``, a ``filter``; or a function reproducing a search of several store calls,
the relevance-score search), which is what the retriever calls after embedding the query. Searches of several queries arrive
batched (one engine call); each runs in a worker thread so a large store does not stall
the runtime loop. The store is held weakly (``engines.user_object``): the runtime drops
the engine when the user's store is collected, so a store built per request is not kept.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, ClassVar

import numpy as np

from .base import Engine
from .user_object import UserObjectRef
from ..runtime.values import StoreSearch


class FrameworkVectorStoreEngine(Engine):
    kind: ClassVar[str] = "vector_store"

    def __init__(self, store: Any, name: str | None = None) -> None:
        super().__init__(name)
        self._store = UserObjectRef(store, "LangChain vector store")

    async def _load(self) -> None:
        return None  # the store is already loaded: it is the user's object

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "store": self._store.type_name}

    @property
    def store(self) -> Any:
        return self._store()

    def _search(self, vectors: Any, how: StoreSearch) -> list[list[Any]]:
        store = self.store
        search = getattr(store, how.method) if how.function is None else functools.partial(how.function, store)
        # as the embedding model returned it: an engine's float32 row, or a model's own floats
        return [search(np.asarray(v).tolist(), **dict(how.kwargs)) for v in vectors]

    async def batch_search(self, requests: list[dict[str, Any]]) -> list[list[list[Any]]]:
        """Requests ``{"index", "vectors", "k", "store_search"?}`` -> one document list per
        vector, per request (without ``store_search``: a similarity search for ``k``)."""
        def how(r: dict[str, Any]) -> StoreSearch:
            return r.get("store_search") or StoreSearch("similarity_search_by_vector", {"k": int(r["k"])})

        return await asyncio.to_thread(lambda: [self._search(r["vectors"], how(r)) for r in requests])
