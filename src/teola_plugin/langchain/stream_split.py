"""Streaming a chain whose last steps put nothing on an engine: as LangChain streams it.

``prompt | llm | JsonOutputParser()`` or ``... | llm | RunnableGenerator(fn)``: the steps after
the last one that uses an engine (the *tail*) are parsers, functions, generators — code whose
stream is its own ``transform`` (partial JSON, one chunk per yielded item). In a graph run they
run once, on the whole text, so the stream would be one chunk. A ``StreamSplit`` runs the steps
up to the last engine step (the *head*) as a graph, its output streaming as it decodes, and
pipes that stream through the tail's own ``transform`` / ``atransform``, each tail step with
its own child run (``seq:step:N``), as ``RunnableSequence`` does. ``invoke`` is not split:
the tail is CPU work the graph runs as well as LangChain does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSequence
from langchain_core.runnables.config import patch_config

from ..capture.langchain.step_runs import step_tag


@dataclass(frozen=True)
class StreamSplit:
    head: Runnable  # the steps up to the last one that uses an engine (a graph run)
    tail: tuple[Runnable, ...]  # the steps after it, streamed by their own transform
    first_tail: int  # the tail's first step's index in the sequence

    @classmethod
    def of(cls, chain: Runnable, uses_engines: Callable[[Runnable], bool]) -> StreamSplit | None:
        """The split of ``chain`` (a ``RunnableSequence``) after its last engine step; None
        when it is not a sequence, its last step uses an engine, or no step does."""
        if not isinstance(chain, RunnableSequence):
            return None
        steps = chain.steps
        engine_steps = [i for i, step in enumerate(steps) if uses_engines(step)]
        if not engine_steps or engine_steps[-1] == len(steps) - 1:
            return None
        k = engine_steps[-1] + 1
        head = steps[0] if k == 1 else RunnableSequence(*steps[:k])
        return cls(head, tuple(steps[k:]), k)

    def _configs(self, config: RunnableConfig, run_manager: Any) -> Sequence[RunnableConfig]:
        return [patch_config(config, callbacks=run_manager.get_child(step_tag(self.first_tail + i)))
                for i in range(len(self.tail))]

    def pipe(self, head_chunks: Iterator[Any], config: RunnableConfig,
             run_manager: CallbackManagerForChainRun) -> Iterator[Any]:
        stream = head_chunks
        for step, step_config in zip(self.tail, self._configs(config, run_manager), strict=True):
            stream = step.transform(stream, step_config)
        return stream

    def apipe(self, head_chunks: AsyncIterator[Any], config: RunnableConfig,
              run_manager: AsyncCallbackManagerForChainRun) -> AsyncIterator[Any]:
        stream = head_chunks
        for step, step_config in zip(self.tail, self._configs(config, run_manager), strict=True):
            stream = step.atransform(stream, step_config)
        return stream
