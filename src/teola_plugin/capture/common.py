"""What both frameworks' capture code shares (one vocabulary for LlamaIndex and LangChain).

``NotLowerable``: the one way a lowering rule declines. Raised before the rule emits
anything, it makes the component run unchanged as one opaque step; its message is the
reason ``explain()`` gives. ``ComponentNote``: one line of that explanation. ``Trace``:
what tracing one app produces, a graph, its notes and the engines it needs that the runtime
may not have yet (``EngineNeeds``: capture records them, the executor provides them); each
framework's trace adds what it needs to feed and read the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import PGraph
from ..runtime.engine_needs import EngineNeeds


class NotLowerable(Exception):
    """A rule cannot lower this component instance: it runs unchanged, for the message's reason."""


@dataclass(frozen=True)
class ComponentNote:
    """One line of explain(): a component that stayed opaque, one that expands at run time,
    or how an index stored its documents."""

    node: str
    component: str
    kind: str  # "opaque", "expands" or "ingestion"
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.component}): {self.reason}"


# explain()'s heading over Trace.expanding, in both frameworks
EXPANDING_HEADER = "Data-dependent steps (sub-graph built at run time, optimized the same way):"


@dataclass
class Trace:
    """A traced app: its graph, what explain() says about its components, and the engines
    to provide before it runs."""

    graph: PGraph
    notes: list[ComponentNote] = field(default_factory=list, kw_only=True)
    engines: EngineNeeds = field(default_factory=EngineNeeds, kw_only=True)

    @property
    def opaque(self) -> list[ComponentNote]:
        """The components that run unchanged, as one opaque step each."""
        return [n for n in self.notes if n.kind == "opaque"]

    @property
    def expanding(self) -> list[ComponentNote]:
        """The steps whose sub-graph is built when they run (it depends on their input)."""
        return [n for n in self.notes if n.kind == "expands"]
