"""What every pass receives besides the graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

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
