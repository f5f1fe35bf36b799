"""What an opaque primitive returns when its work is only known at run time.

A refine loop over N chunks, a sub-question engine's questions, a ``RunnableEach`` over a
list: the primitive's function returns an :class:`Expansion`, and the runtime's graph
scheduler runs its graph as part of the same query; the primitive's outputs are that
graph's outputs. Capture builds expansions and the runtime runs them, so the record lives
here, below both (capture never imports the runtime for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Expansion:
    """``graph`` run on ``inputs`` in place of the primitive that returned it."""

    graph: Any  # PGraph
    inputs: Mapping[str, Any]
    # The sub-graph's nodes whose tokens are the expanding node's text when that text is what
    # the caller streams; None: the nodes producing the sub-graph's outputs.
    token_nodes: frozenset[str] | None = None
    # The outputs to use instead when the sub-graph raises one of these (a framework that
    # drops a failed sub-query, as LlamaIndex's sub-question engine drops a ValueError).
    recover: tuple[type[Exception], Callable[[Exception], Mapping[str, Any]]] | None = None
    # Watches the sub-graph's run node by node (``runtime/run_observer.py``: a framework's
    # own run reports, e.g. the run of the LangChain sub-chain it is); None: nobody.
    observer: Any = None
