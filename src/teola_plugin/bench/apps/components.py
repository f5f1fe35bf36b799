"""Small framework components the apps need that neither framework ships for our engines.

Each is written as a user writes an integration with a service: a LangChain retriever over a
search API, a LlamaIndex reranking postprocessor calling a rerank service. Here the services
are the runtime's own BM25 search and reranker engines, so plain and Teola runs share them.
Under Teola they run as opaque steps (their own code, unchanged) until the plugin traces them.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document as LCDocument
from langchain_core.retrievers import BaseRetriever as LCRetriever
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import ConfigDict

from ...engines.base import Hit
from ...runtime.policies import Priority
from ...runtime.runtime import Runtime


async def _submit(runtime: Runtime, engine: str, op: str, payload: dict[str, Any]) -> Any:
    await runtime.start_engines(engine)
    result, _ = await runtime.engines(engine).submit(op, payload, Priority())
    return result


def _rerank_hits(runtime: Runtime, query: str, hits: list[Hit], top_n: int) -> Any:
    return _submit(runtime, "reranker", "rerank", {"query": query, "hits": hits, "top_n": top_n})


class SearchEngineRetriever(LCRetriever):
    """LangChain retriever over the runtime's BM25 search engine (a local 'web search')."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    runtime: Any
    k: int = 3

    def _docs(self, hits: list[Hit]) -> list[LCDocument]:
        return [LCDocument(page_content=h.text, id=h.id, metadata={**h.metadata, "score": h.score}) for h in hits]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[LCDocument]:
        (hits,) = self.runtime.run_sync(_submit(self.runtime, "search", "search", {"queries": [query], "k": self.k}))
        return self._docs(hits)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[LCDocument]:
        (hits,) = await self.runtime.run_async(
            _submit(self.runtime, "search", "search", {"queries": [query], "k": self.k}))
        return self._docs(hits)


class EngineRerank(BaseNodePostprocessor):
    """LlamaIndex node postprocessor: rerank on the runtime's reranker engine, keep ``top_n``."""

    top_n: int = Field(default=3)
    _runtime: Runtime = PrivateAttr()

    def __init__(self, runtime: Runtime, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runtime = runtime

    @classmethod
    def class_name(cls) -> str:
        return "EngineRerank"

    def _request(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None) -> tuple[str, list[Hit]]:
        if query_bundle is None:
            raise ValueError("EngineRerank needs the query")
        return query_bundle.query_str, [Hit(str(i), 0.0, n.node.get_content()) for i, n in enumerate(nodes)]

    @staticmethod
    def _pick(nodes: list[NodeWithScore], hits: list[Hit]) -> list[NodeWithScore]:
        return [NodeWithScore(node=nodes[int(h.id)].node, score=h.score) for h in hits]

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if not nodes:
            return []
        query, hits = self._request(nodes, query_bundle)
        return self._pick(nodes, self._runtime.run_sync(_rerank_hits(self._runtime, query, hits, self.top_n)))

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if not nodes:
            return []
        query, hits = self._request(nodes, query_bundle)
        return self._pick(nodes, await self._runtime.run_async(_rerank_hits(self._runtime, query, hits, self.top_n)))
