"""The engines a traced graph runs on that its runtime may not have yet.

Capture builds graphs and nothing else. A rule lowering onto an engine that exists only once
the app's objects are known records it here instead of registering it: a model server's
engine (an ``EngineSpec``, configured on first use) or an in-process engine wrapping the
user's own object (a vector store: built, and bound to the retrievers that search it, only
when provided). The executor hands the record to :meth:`Runtime.provide` before the graph
runs. One record for both frameworks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class LocalEngine:
    """An in-process engine over a user's object. ``make`` builds it the first time the
    runtime needs it (one per name and runtime); it goes when ``owner`` is collected. Each of
    ``binds`` (a retriever of the store) is handed to the engine's ``bind`` once provided."""

    make: Callable[[], Any]
    owner: Any = None
    binds: list[Any] = field(default_factory=list)


@dataclass
class EngineNeeds:
    served: dict[str, Any] = field(default_factory=dict)  # engine name -> EngineSpec
    local: dict[str, LocalEngine] = field(default_factory=dict)

    def served_engine(self, endpoint: Any) -> str:
        """The name of the engine that sends requests to ``endpoint`` (a ``ServerEndpoint``)."""
        spec = endpoint.engine_spec()
        self.served.setdefault(spec.name, spec)
        return spec.name

    def local_engine(self, name: str, make: Callable[[], Any], owner: Any = None, bind: Any = None) -> str:
        need = self.local.setdefault(name, LocalEngine(make, owner))
        if bind is not None and all(b is not bind for b in need.binds):
            need.binds.append(bind)
        return name

    def update(self, other: EngineNeeds) -> None:
        """Also need what ``other`` (a nested trace) needs."""
        self.served.update(other.served)
        for name, need in other.local.items():
            mine = self.local.setdefault(name, LocalEngine(need.make, need.owner))
            mine.binds.extend(b for b in need.binds if all(b is not m for m in mine.binds))

    def __bool__(self) -> bool:
        return bool(self.served or self.local)
