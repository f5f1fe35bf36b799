"""What plain framework runs spent their time on, from the frameworks' own instrumentation.

Plain LlamaIndex / LangChain calls never go through Teola's graph scheduler, so they leave
no primitive timeline. Both frameworks report their component calls to observers (LlamaIndex's
instrumentation dispatcher, LangChain's callbacks); :class:`EventRecorder` turns those into
``(kind, start, end)`` intervals: the share of a query's latency spent in the LLM, and the
plain side of the Gantt chart.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler

KINDS = {"LLMChat": "llm", "LLMCompletion": "llm", "Embedding": "embed", "Retrieval": "retrieve",
         "ReRank": "rerank", "Synthesize": "synthesize"}


@dataclass(frozen=True)
class Interval:
    kind: str
    start: float
    end: float


class EventRecorder:
    """Collects intervals from both frameworks while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.intervals: list[Interval] = []
        self._open: dict[Any, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self.langchain = _LangChainCallbacks(self)
        get_dispatcher().add_event_handler(_LlamaIndexEvents(recorder=self))

    def reset(self) -> None:
        with self._lock:
            self.intervals.clear()
            self._open.clear()

    def begin(self, key: Any, kind: str) -> None:
        if self.active:
            with self._lock:
                self._open[key] = (kind, time.time())

    def finish(self, key: Any) -> None:
        if self.active:
            with self._lock:
                opened = self._open.pop(key, None)
                if opened is not None:
                    self.intervals.append(Interval(opened[0], opened[1], time.time()))

    def busy_s(self, kind: str = "llm") -> float:
        """Wall time during which at least one ``kind`` call was in flight (union of intervals)."""
        spans = sorted((i.start, i.end) for i in self.intervals if i.kind == kind)
        total, cur_start, cur_end = 0.0, None, None
        for s, e in spans:
            if cur_end is None or s > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        if cur_end is not None:
            total += cur_end - cur_start
        return total


class _LlamaIndexEvents(BaseEventHandler):
    recorder: Any = None

    @classmethod
    def class_name(cls) -> str:
        return "TeolaBenchEvents"

    def handle(self, event: Any, **kwargs: Any) -> None:
        name = type(event).__name__
        for suffix, opening in (("StartEvent", True), ("EndEvent", False)):
            if name.endswith(suffix):
                family = name[: -len(suffix)]
                kind = KINDS.get(family)
                if kind is not None:
                    key = ("li", family, event.span_id)
                    self.recorder.begin(key, kind) if opening else self.recorder.finish(key)
                return


class _LangChainCallbacks(BaseCallbackHandler):
    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.begin(run_id, "llm")

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.begin(run_id, "llm")

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.finish(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.finish(run_id)

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.begin(run_id, "retrieve")

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.finish(run_id)
