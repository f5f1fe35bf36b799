"""What every pass receives besides the graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .cost import CostModel


@dataclass
class PassContext:
    """The cost model, pass options (each pass documents its own), and a notes channel:
    a pass says *why* it changed the graph with :meth:`note`; the manager records it."""

    cost_model: CostModel = field(default_factory=CostModel.default)
    options: Mapping[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def option(self, name: str, default: Any) -> Any:
        return self.options.get(name, default)

    def note(self, message: str) -> None:
        self.notes.append(message)
