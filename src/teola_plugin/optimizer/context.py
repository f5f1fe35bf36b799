"""What every pass receives besides the graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..ir.analysis import finish_times
from ..ir.graph import PGraph
from ..ir.node import Primitive
from .cost import CostModel


@dataclass
class PassContext:
    """The cost model, pass options (each pass documents its own), and a notes channel:
    a pass says *why* it changed the graph with :meth:`note`; the manager records it."""

    cost_model: CostModel = field(default_factory=CostModel.default)
    options: Mapping[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Primitives are immutable and a pass's output shares the untouched ones with its
    # input, so node costs are memoized per primitive for one optimizer run.
    cost_cache: dict[Primitive, float] = field(default_factory=dict, repr=False)
    finish_cache: tuple[PGraph, dict[str, float]] | None = field(default=None, repr=False)

    def finish_times(self, graph: PGraph) -> dict[str, float]:
        """Earliest finish of each node (unlimited engines); memoized for the last graph
        asked about, which the manager and a pass often share."""
        if self.finish_cache is None or self.finish_cache[0] is not graph:
            self.finish_cache = (graph, finish_times(graph, self.cost)[0])
        return self.finish_cache[1]

    def critical_path_length(self, graph: PGraph) -> float:
        return max(self.finish_times(graph).values(), default=0.0)

    def cost(self, prim: Primitive) -> float:
        """``cost_model.node_cost(prim)``, memoized."""
        value = self.cost_cache.get(prim)
        if value is None:
            value = self.cost_cache[prim] = self.cost_model.node_cost(prim)
        return value

    def option(self, name: str, default: Any) -> Any:
        return self.options.get(name, default)

    def note(self, message: str) -> None:
        self.notes.append(message)
