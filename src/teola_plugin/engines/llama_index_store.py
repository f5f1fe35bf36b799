"""An engine that searches a LlamaIndex vector store the user built: their instance, never a copy.

Each search request names an *index*, which is bound to one ``VectorIndexRetriever``; the
engine answers it with that retriever's own code path after the embedding step
(``_get_nodes_with_embeddings``: the ``VectorStoreQuery`` it builds — top-k, filters,
mode, node / doc ids, vector-store kwargs — the store query, the docstore fetch and the
conversion to ``NodeWithScore``), so the nodes and scores are what the retriever returns.

Inserts (``vector_insert`` of documents whose ingestion a query's graph joined) go to the
``Claim`` registered for the join id their documents carry (``metadata["claim"]``, unique per
trace; :meth:`expect`), which stores the nodes with LlamaIndex's own ``_add_nodes_to_index``
in their original order. Routing by join id rather than by index name means a late insert of
an abandoned run can never reach a newer run's claim on the same index.

Served in-process (``Runtime.add_local_engine``): the store is a live Python object that
must not be pickled into an actor. The store and the bound retrievers are held weakly
(``user_object``): an app that builds an index per request does not have the runtime keep
them all; the runtime drops the engine with its store. Knows nothing about graphs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

from ..errors import EngineInputError
from ..runtime.caller import on_loop
from .base import Engine
from .user_object import UserObjectRef


class LlamaIndexStoreEngine(Engine):
    """Vector search on one LlamaIndex vector store, one bound retriever per index name."""

    kind: ClassVar[str] = "vector_store"

    def __init__(self, vector_store: Any, name: str | None = None) -> None:
        super().__init__(name)
        self._store = UserObjectRef(vector_store, "LlamaIndex vector store")
        # index name -> retriever; a per-request query engine's retriever goes with it
        self._retrievers: dict[str, UserObjectRef[Any]] = {}
        self._bind_lock = threading.Lock()  # executors trace (and bind) in several threads
        self._claims: dict[str, Any] = {}  # join id -> Claim of the run inserting those nodes

    @property
    def vector_store(self) -> Any:
        return self._store()

    @staticmethod
    def index_name(retriever: Any) -> str:
        """The index name :meth:`bind` gives ``retriever`` (known before the engine exists)."""
        return f"retriever-{id(retriever):x}"

    def bind(self, retriever: Any) -> str:
        """Route searches on the returned index name through ``retriever``'s query settings
        (while the retriever lives: the query's plan holds it)."""
        if retriever._vector_store is not self.vector_store:
            raise EngineInputError(f"engine {self.name!r}: the retriever searches another vector store")
        index = self.index_name(retriever)
        with self._bind_lock:
            for name in [n for n, ref in self._retrievers.items() if not ref.alive()]:
                del self._retrievers[name]  # a collected retriever's id may be reused
            self._retrievers[index] = UserObjectRef(retriever, "LlamaIndex retriever")
        return index

    def expect(self, join_id: str, claim: Any) -> None:
        """Route inserts whose documents name ``join_id`` to ``claim`` until :meth:`forget`."""
        routed = self._claims.setdefault(join_id, claim)
        if routed is not claim:  # join ids are unique per trace: a second claim is a bug, not a retry
            raise RuntimeError(f"engine {self.name!r}: join {join_id!r} already routes to another claim")

    def forget(self, join_id: str, claim: Any) -> None:
        """Stop routing ``join_id`` to ``claim`` (only that claim's route goes)."""
        if self._claims.get(join_id) is claim:
            del self._claims[join_id]

    async def batch_insert(self, requests: list[dict[str, Any]]) -> list[int]:
        """Requests ``{"index", "ids", "vectors", "metadatas", ...}``: ids are node positions in
        the claim that every document's ``metadata["claim"]`` names."""
        # Claims resolved here, before the thread runs: what each request was routed to is fixed.
        claims = [self._claim_for(i, r) for i, r in enumerate(requests)]

        def insert_all() -> list[int]:
            # The batch is checked whole before anything is stored (the engine scheduler reruns
            # a failed batch request by request); a claim closing after this check only turns
            # its own late insert away, and a re-sent position is never stored twice.
            for i, claim in enumerate(claims):
                if claim.closed:  # the same error Claim.receive raises
                    raise RuntimeError(f"insert request {i}: insert of an abandoned ingestion run "
                                       "(its nodes are pending again)")
            for r, claim in zip(requests, claims):
                claim.receive([int(p) for p in r["ids"]], list(r["vectors"]))
            return [len(r["ids"]) for r in requests]

        return await asyncio.to_thread(insert_all)

    def _claim_for(self, i: int, request: dict[str, Any]) -> Any:
        metadatas = request.get("metadatas") or [{}]
        named = {m.get("claim") if isinstance(m, dict) else None for m in metadatas}
        if len(named) != 1:
            raise EngineInputError(f"insert request {i}: its documents name several joins {sorted(map(str, named))} "
                                   f"on engine {self.name!r}")
        (join_id,) = named
        claim = self._claims.get(join_id)
        if claim is None:
            raise EngineInputError(f"insert request {i}: no pending ingestion for join {join_id!r} "
                                   f"(index {request.get('index')!r}) on engine {self.name!r}")
        return claim

    async def _load(self) -> None:  # the user's store is already open
        return None

    def describe(self) -> dict[str, Any]:
        with self._bind_lock:
            indexes = sorted(n for n, ref in self._retrievers.items() if ref.alive())
        return {**super().describe(), "store": self._store.type_name, "indexes": indexes}

    async def batch_search(self, requests: list[dict[str, Any]]) -> list[list[list[Any]]]:
        """Requests ``{"index", "vectors", "k"}`` -> one ranked ``NodeWithScore`` list per vector.
        ``k`` is the retriever's own ``similarity_top_k`` (the lowering copied it)."""
        for i, r in enumerate(requests):
            if r.get("index") not in self._retrievers:
                raise EngineInputError(f"search request {i}: unknown index {r.get('index')!r} on engine "
                                       f"{self.name!r} (bound: {sorted(self._retrievers)})")
        # A store's own async search serves an async caller, on its loop, as plain's aretrieve
        # (Qdrant's async client); the rest is synchronous Python, off the event loop.
        in_thread = [r for r in requests if r.get("caller_loop") is None]
        searched = iter(await asyncio.to_thread(self._search_all, in_thread) if in_thread else ())
        return [next(searched) if r.get("caller_loop") is None else await self._search_as_the_caller(r)
                for r in requests]

    async def _search_as_the_caller(self, request: dict[str, Any]) -> list[list[Any]]:
        from llama_index.core.schema import QueryBundle

        from ..llama_index.pending_ingestion import no_flush

        retriever = self._retrievers[request["index"]]()

        async def search(vector: list[float]) -> list[Any]:
            with no_flush():  # the run searches what it joined
                return await retriever._aget_nodes_with_embeddings(QueryBundle(query_str="", embedding=vector))

        return [await on_loop(request["caller_loop"], search, row.tolist()) for row in request["vectors"]]

    def _search_all(self, requests: list[dict[str, Any]]) -> list[list[list[Any]]]:
        from ..llama_index.pending_ingestion import no_flush

        with no_flush():  # the run searches what it joined: nodes deferred since wait for their reader
            return self._search_each(requests)

    def _search_each(self, requests: list[dict[str, Any]]) -> list[list[list[Any]]]:
        from llama_index.core.schema import QueryBundle

        out = []
        for r in requests:
            retriever = self._retrievers[r["index"]]()
            # query_str is not part of a vector search request; the lowering only routes
            # stores and modes here whose results depend on the embedding alone.
            out.append([retriever._get_nodes_with_embeddings(QueryBundle(query_str="", embedding=list(v)))
                        for v in (row.tolist() for row in r["vectors"])])
        return out
