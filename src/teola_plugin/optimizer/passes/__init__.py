"""The optimizer passes: each module is one pure function ``run(graph, ctx) -> PGraph``
with a ``NAME`` and a one-line ``DESCRIPTION``. A pass never mutates its input; when it
has nothing to do it returns the input itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir.graph import PGraph
from ..context import PassContext
from . import (decompose_stages, eliminate_common, eliminate_dead, pipeline_decode,
               prune_dependencies, split_prefill)


@dataclass(frozen=True)
class Pass:
    name: str
    description: str
    run: Callable[[PGraph, PassContext], PGraph]


_MODULES = (prune_dependencies, eliminate_common, decompose_stages, split_prefill,
            pipeline_decode, eliminate_dead)
PASSES: dict[str, Pass] = {m.NAME: Pass(m.NAME, m.DESCRIPTION, m.run) for m in _MODULES}
DEFAULT_ORDER: tuple[str, ...] = tuple(PASSES)  # prune, cse, decompose, split, pipeline, dead
ALIASES = {"prune": "prune_dependencies", "cse": "eliminate_common", "decompose": "decompose_stages",
           "dead": "eliminate_dead", "dce": "eliminate_dead"}

__all__ = ["ALIASES", "DEFAULT_ORDER", "PASSES", "Pass"]
