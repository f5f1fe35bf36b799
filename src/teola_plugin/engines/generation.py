"""What an LLM engine returns, whether it runs vLLM in-process or calls a model server.

The graph's ``llm_prefill`` / ``llm_decode`` handlers read only these records, so both
kinds of LLM engine are scheduled, pipelined and timed alike. ``response`` is set by engines
that call a server: the server's own reply (an ``openai`` SDK object), from which a framework
builds its own result types (usage, ids, finish reasons) exactly as its client would.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass
from typing import Any

from .base import Engine


@dataclass(frozen=True)
class Generation:
    """A finished request."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None  # "stop", "length", "abort"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    response: Any = None  # the server's reply (served models); None in-process


@dataclass(frozen=True)
class GenerationDelta:
    """One step of a streamed request: the new text since the last delta."""

    request_id: str
    text: str
    num_generated_tokens: int
    finished: bool
    finish_reason: str | None = None
    response: Any = None  # on the last delta of a served model's request: the server's reply
    stream_end: bool = False
    """Only says that a served stream ended (no chunk of the server's): it carries no token.
    Every other delta of a served stream is one chunk, as the framework's client yields one
    response per chunk, empty ones included."""
    chunk: Any = None  # a served stream's chunk this delta is (what a framework's per-chunk events carry)


@dataclass(frozen=True)
class PrefillResult:
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int


class LLMEngine(Engine):
    """What both LLM engines share: request ids and the batched entry points (the model
    batches continuously, in-process or on its server: submitting concurrently is the batch).
    Subclasses implement ``generate``, ``prefill``, ``stream`` and ``abort``."""

    kind = "llm"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._ids = itertools.count()

    def _new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}-{next(self._ids)}"

    async def batch_generate(self, requests: list[dict[str, Any]]) -> list[Generation]:
        return list(await asyncio.gather(*(self.generate(**r) for r in requests)))  # type: ignore[attr-defined]

    async def batch_prefill(self, requests: list[dict[str, Any]]) -> list[PrefillResult]:
        return list(await asyncio.gather(*(self.prefill(**r) for r in requests)))  # type: ignore[attr-defined]
