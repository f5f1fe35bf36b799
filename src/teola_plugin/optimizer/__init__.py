"""Graph-to-graph optimizations of a PGraph, each pass one file, each explainable.

    from teola_plugin.optimizer import optimize
    fast = optimize(graph)                      # all passes, default cost model
    print(fast.explain())

Never calls an engine: costs come from :class:`CostModel` profiles.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..ir.graph import PGraph
from .context import PassContext
from .cost import CostModel, Curve, DEFAULT_PROFILES
from .manager import PassManager, available_passes
from .passes import DEFAULT_ORDER, PASSES


def optimize(graph: PGraph, passes: Sequence[str] | None = None, disabled: Iterable[str] = (),
             cost_model: CostModel | None = None) -> PGraph:
    """Run the pass manager once: ``PassManager(passes, disabled).run(graph, cost_model)``."""
    return PassManager(passes, disabled).run(graph, cost_model)


__all__ = ["CostModel", "Curve", "DEFAULT_ORDER", "DEFAULT_PROFILES", "PASSES", "PassContext",
           "PassManager", "available_passes", "optimize"]
