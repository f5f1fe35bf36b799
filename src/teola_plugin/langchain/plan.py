"""An execution plan: one optimized trace of a chain, bound to a runtime and ready to run.

``TeolaRunnable`` keeps one plan per input layout (see ``InputLayout``): tracing and
optimizing happen once, every later call only executes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..capture.langchain import LangChainTrace
from ..ir.graph import PGraph
from ..optimizer import optimize
from ..runtime.runtime import Runtime
from ..runtime.values import IndexHandle
from .vector_store import FrameworkVectorStoreEngine


@dataclass
class ExecutionPlan:
    trace: LangChainTrace
    graph: PGraph  # optimized

    @classmethod
    def build(cls, trace: LangChainTrace, passes: Sequence[str] | None = None,
              disabled: Iterable[str] = ()) -> ExecutionPlan:
        return cls(trace, optimize(trace.graph, passes=passes, disabled=disabled))

    def graph_inputs(self, input: Any) -> dict[str, Any]:
        feed = self.trace.layout.feed(input)
        for name, (engine, _) in self.trace.stores.items():
            feed[name] = IndexHandle(engine)
        return feed

    async def _serve_stores(self, runtime: Runtime) -> None:
        for engine, store in self.trace.stores.values():
            await runtime.add_local_engine(engine, FrameworkVectorStoreEngine(store, name=engine))

    async def execute(self, runtime: Runtime, input: Any, *, timeout_s: float | None = None,
                      on_token: Callable[[str], None] | None = None) -> Any:
        """Run one call on the runtime loop; ``on_token`` receives the output's text deltas."""
        await self._serve_stores(runtime)
        tokens = self.trace.output.tokens_from
        out = await runtime.execute(
            self.graph, self.graph_inputs(input), timeout_s=timeout_s,
            on_token=(lambda text: text and on_token(text)) if on_token else None,
            token_nodes=frozenset({tokens}) if tokens and on_token else frozenset())
        return out["output"]

    def explain(self) -> str:
        lines = [self.graph.explain().rstrip("\n")]
        if self.trace.opaque:
            lines.append("Opaque components (run unchanged, as LangChain would run them):")
            lines += [f"  - {o.component} (primitive {o.node!r}): {o.reason}" for o in self.trace.opaque]
        else:
            lines.append("Opaque components: none (every component was lowered to primitives)")
        return "\n".join(lines) + "\n"
