"""Named records of a request's life on an engine (vLLM's ``Request`` in spirit).

* :class:`EngineRequest`: one primitive's request, queued by an engine scheduler (heap order
  by ``key``) or coalesced by a Ray handle into one actor call.
* :class:`BatchInfo`: where and how it ran (the execution timeline records it).
* :class:`StreamOpen`: an engine stream run to its first item (an LLM's prefill), handed from
  the engine server through hosting, the graph scheduler and the model classes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .policies import Priority


@dataclass(frozen=True)
class BatchInfo:
    """Where and how a request ran: recorded in the execution timeline."""

    engine: str
    batch_id: int
    size: int
    start: float
    end: float


@dataclass(order=True)
class EngineRequest:
    """One request to one engine. Only ``key`` orders requests (the batch policy's priority
    key); ``token`` names it to a Ray actor so a cancel can reach it there."""

    key: tuple[Any, ...]
    op: str = field(compare=False)
    payload: Any = field(compare=False)
    priority: Priority = field(compare=False)
    future: asyncio.Future[Any] = field(compare=False)
    token: str = field(default="", compare=False)
    enqueued: float = field(default=0.0, compare=False)  # time.time() when queued


@dataclass(frozen=True)
class StreamOpen:
    """A stream opened and run to its first item. ``sid`` names it for resume / close while
    it is not ``finished`` (a finished stream keeps nothing open: its ``sid`` may be "")."""

    sid: str
    first: list[Any]
    finished: bool
    info: BatchInfo
