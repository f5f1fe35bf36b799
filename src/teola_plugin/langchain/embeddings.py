"""LangChain ``Embeddings`` computed by the Teola runtime's embedder engine.

Requests go through the engine's scheduler, so concurrent callers share batches; a
retriever lowered by ``TeolaRunnable`` embeds its query on the same engine, so plain and
Teola runs compare the same vectors.
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field

from ..runtime.app_runs import call_priority
from ..runtime.runtime import Runtime, default_runtime
from ..runtime.bridge import started_pool


class TeolaEmbeddings(BaseModel, Embeddings):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    runtime: Any = Field(default=None, exclude=True)
    """The Teola ``Runtime`` whose engines serve this model; default: ``default_runtime()``."""
    engine: str = "embedder"

    def teola_runtime(self) -> Runtime:
        return self.runtime if self.runtime is not None else default_runtime()

    def teola_embedder_engine(self) -> str:
        return self.engine

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        pool = await started_pool(self.teola_runtime(), self.engine)
        vectors, _ = await pool.submit("embed", {"texts": texts}, call_priority())
        return [[float(x) for x in v] for v in vectors]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.teola_runtime().run_sync(self._embed(list(texts))) if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self.teola_runtime().run_sync(self._embed([text]))[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await self.teola_runtime().run_async(self._embed(list(texts))) if texts else []

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.teola_runtime().run_async(self._embed([text])))[0]
