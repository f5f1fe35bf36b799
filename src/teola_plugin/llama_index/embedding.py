"""``TeolaEmbedding``: a LlamaIndex embedding model served by the runtime's embedder engine.

Plain LlamaIndex calls it through ``BaseEmbedding``; under the executor the tracer lowers
the query embedding to an ``embed`` primitive on the same engine (``teola_embedder_engine()``), so both
paths produce the same vectors from the same model.
"""

from __future__ import annotations

from typing import Any, ClassVar

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from ..runtime.app_runs import call_priority
from ..runtime.runtime import Runtime, default_runtime


class TeolaEmbedding(BaseEmbedding):
    """Embeddings from the Teola runtime's embedder engine (normalised; dot = cosine)."""

    # What a lowered embedding replaces (capture/overrides.py): a subclass overriding one of
    # these keeps its own code.
    teola_lowered_calls: ClassVar[tuple[str, ...]] = (
        "get_query_embedding", "aget_query_embedding", "_get_query_embedding", "_aget_query_embedding",
        "get_text_embedding", "aget_text_embedding", "_get_text_embedding", "_aget_text_embedding",
        "_get_text_embeddings", "_aget_text_embeddings", "get_text_embedding_batch", "aget_text_embedding_batch")

    engine: str = Field(default="embedder", description="Name of the runtime's embedder engine.")
    model_name: str = Field(default="teola:embedder")

    _runtime: Runtime | None = PrivateAttr(default=None)

    def __init__(self, runtime: Runtime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runtime = runtime

    @classmethod
    def class_name(cls) -> str:
        return "TeolaEmbedding"

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = default_runtime()
        return self._runtime

    def teola_embedder_engine(self) -> str:
        """The engine computing these vectors (``capture/lowerable.py``)."""
        return self.engine

    async def _embed(self, texts: list[str]) -> list[Embedding]:
        await self.runtime.start_engines(self.engine)
        # queued like every other request: the engine scheduler's priority and batching apply
        vectors, _ = await self.runtime.engines(self.engine).submit("embed", {"texts": texts}, call_priority())
        return [row.tolist() for row in vectors]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self.runtime.run_sync(self._embed([query]))[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self.runtime.run_async(self._embed([query])))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self.runtime.run_sync(self._embed([text]))[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self.runtime.run_async(self._embed([text])))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.runtime.run_sync(self._embed(list(texts))) if texts else []

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return (await self.runtime.run_async(self._embed(list(texts)))) if texts else []
