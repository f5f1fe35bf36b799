"""Module order: how a framework's sequential code becomes control dependencies.

LlamaIndex and LangChain run an app's modules one after another (a LangChain parallel's
branches side by side). The tracers record exactly that: every primitive they emit waits
(``after``) on the *frontier*, what was emitted last. Dependency pruning (an optimizer
pass) then removes the waits that are not data flow, which is where the parallelism the
framework left on the table comes from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..ir.graph import PGraph
from ..ir.node import Primitive
from ..ir.ops import Op

V = TypeVar("V")


class ModuleOrder:
    """Appends primitives to ``graph`` in module order."""

    def __init__(self, graph: PGraph) -> None:
        self.graph = graph
        self.frontier: frozenset[str] = frozenset()  # what the next primitive waits on

    def add(self, op: Op, **kwargs: Any) -> Primitive:
        """Append a primitive after the frontier; it becomes the frontier."""
        prim = self.graph.add(op, after=self.frontier, **kwargs)
        self.frontier = frozenset({prim.name})
        return prim

    def branches(self, lowerings: Iterable[Callable[[], V]]) -> list[V]:
        """Emit concurrent branches: each starts from the same frontier; afterwards the
        frontier is all their ends."""
        start, ends, values = self.frontier, set(), []
        for lower in lowerings:
            self.frontier = start
            values.append(lower())
            ends |= self.frontier
        self.frontier = frozenset(ends) if ends else start
        return values
