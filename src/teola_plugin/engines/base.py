"""The contract every engine honours, whether it runs in-process or inside a Ray actor.

An engine is a long-lived object that owns one expensive resource (a model, a store).
Two ways in:

* typed async methods for people and adapters (``embed(texts)``, ``search(index, vectors, k)``,
  ``generate(prompt, params)``), each validating its input and raising
  :class:`~teola_plugin.errors.EngineInputError` before touching state;
* one uniform batched entry point for the engine schedulers, :meth:`Engine.execute`:
  ``execute(op, requests) -> results``, one result per request, in order. Requests of
  several queries are merged into one model call where the engine can (that is where
  cross-query batching pays), and split back.

Engines know nothing about graphs or queries; schedulers know nothing about models.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import EngineInputError, EngineNotStartedError, ModelLoadError


@dataclass(frozen=True)
class Hit:
    """One retrieved item: a vector-store neighbour, a search result, a reranked document."""

    id: str
    score: float
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


BatchHandler = Callable[[list[dict[str, Any]]], Awaitable[list[Any]]]


class Engine(abc.ABC):
    """Base class: lifecycle, the batched ``execute`` dispatch, shared input checks.

    Subclasses set ``kind`` and implement ``_load`` plus one ``batch_<op>`` coroutine per
    operation they serve. ``batch_<op>(requests)`` receives a list of keyword dicts (the
    same keywords as the typed method) and returns one result per request.
    """

    kind: ClassVar[str] = "engine"
    # Its stream methods take the request's ``priority`` (the runtime's Priority): a model
    # server that schedules by priority gets it (``llm_served.py``); others order by admission.
    accepts_priority: ClassVar[bool] = False

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.kind
        self._started = False

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model / open the store. Idempotent."""
        if not self._started:
            await self._load()
            self._started = True

    async def close(self) -> None:
        """Release the resource. Idempotent; the engine can be started again."""
        if self._started:
            await self._unload()
            self._started = False

    @property
    def started(self) -> bool:
        return self._started

    @abc.abstractmethod
    async def _load(self) -> None: ...

    async def _unload(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        """Static facts for schedulers and reports (kind, model, limits)."""
        return {"kind": self.kind, "name": self.name, "ops": sorted(self.ops())}

    # -- batched dispatch ----------------------------------------------------------------
    @classmethod
    def ops(cls) -> set[str]:
        return {n[len("batch_"):] for n in dir(cls) if n.startswith("batch_")}

    async def execute(self, op: str, requests: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run a batch of ``op`` requests (possibly from many queries); results in order."""
        handler: BatchHandler | None = getattr(self, f"batch_{op}", None)
        if handler is None:
            raise EngineInputError(
                f"engine {self.name!r} ({self.kind}) has no operation {op!r}; "
                f"it serves {sorted(self.ops())}"
            )
        self._require_started()
        results = await handler([dict(r) for r in requests])
        if len(results) != len(requests):  # an engine bug, never the caller's
            raise RuntimeError(
                f"engine {self.name!r} returned {len(results)} results for {len(requests)} {op} requests"
            )
        return results

    @staticmethod
    def request_items(op: str, payload: Mapping[str, Any]) -> int:
        """Work items in one request (what batch caps count): the length of its list."""
        for key in ("texts", "hits", "vectors", "queries", "ids"):
            value = payload.get(key) if isinstance(payload, Mapping) else None
            if value is not None and hasattr(value, "__len__") and not isinstance(value, str):
                return max(1, len(value))
        return 1

    # -- shared checks -----------------------------------------------------------------
    def _require_started(self) -> None:
        if not self._started:
            raise EngineNotStartedError(f"engine {self.name!r} is not started; await engine.start() first")


def check_texts(texts: Any, what: str = "texts", allow_empty: bool = False) -> list[str]:
    """Validate a list of strings; a bare string is a common mistake, so name it."""
    if isinstance(texts, str):
        raise EngineInputError(f"{what} must be a list of strings, got a single str; wrap it in a list")
    if not isinstance(texts, Sequence):
        raise EngineInputError(f"{what} must be a list of strings, got {type(texts).__name__}")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise EngineInputError(f"{what}[{i}] must be str, got {type(t).__name__}")
    if not out and not allow_empty:
        raise EngineInputError(f"{what} is empty")
    return out


def lone_surrogate(texts: Sequence[str]) -> str | None:
    """Where the first lone surrogate (``"\\ud800"``: not valid Unicode, so no tokenizer can
    encode it) sits in ``texts``, said for an error message; ``None`` when there is none."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"text {i} holds a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}, "
                    "which is not valid Unicode (e.g. bytes decoded with errors='surrogateescape'); "
                    "clean it (text.encode('utf-8', 'replace').decode()) before sending it")
    return None


def check_cuda_available(device: str) -> None:
    """A CUDA device was asked for: fail with a clear message where torch sees none."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but torch sees no CUDA device")


def split_back(flat: Sequence[Any], sizes: Sequence[int]) -> list[list[Any]]:
    """Undo the concatenation of several requests' items (cross-query batching)."""
    out, start = [], 0
    for n in sizes:
        out.append(list(flat[start : start + n]))
        start += n
    return out
