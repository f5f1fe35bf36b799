"""An engine that does no work, to measure what the runtime itself costs per primitive."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engines.base import Engine


class NoopEmbedder(Engine):
    """Answers ``embed`` at once with zero vectors: the scheduling overhead benchmark's engine."""

    kind = "embedder"

    async def _load(self) -> None:
        return None

    async def batch_embed(self, requests: list[dict[str, Any]]) -> list[np.ndarray]:
        return [np.zeros((len(r["texts"]), 4), dtype=np.float32) for r in requests]
