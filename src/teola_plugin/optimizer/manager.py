"""PassManager: run passes in order, check every result, record what each one changed."""

from __future__ import annotations

import gc

from typing import Any, Iterable, Mapping, Sequence

from ..errors import ConfigError, GraphValidationError
from ..ir.graph import PGraph
from ..ir.history import PassRecord
from .context import PassContext
from .cost import CostModel
from .passes import ALIASES, DEFAULT_ORDER, PASSES, Pass


def available_passes() -> dict[str, str]:
    """Pass name -> one-line description, in the default order."""
    return {name: PASSES[name].description for name in DEFAULT_ORDER}


def _resolve(names: Iterable[str], what: str) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ConfigError(f"{what} must be a list of optimizer pass names, got {type(names).__name__} {names!r:.60}")
    resolved = []
    for name in names:
        if not isinstance(name, str):
            raise ConfigError(f"{what} must hold pass names (str), got {type(name).__name__} {name!r:.60}")
        canonical = ALIASES.get(name, name)
        if canonical not in PASSES:
            valid = ", ".join(list(DEFAULT_ORDER) + sorted(ALIASES))
            raise ConfigError(f"unknown optimizer pass {name!r} in {what}; valid names: {valid}")
        resolved.append(canonical)
    return resolved


class PassManager:
    """``PassManager()`` runs every pass in :data:`DEFAULT_ORDER`; ``passes=[...]`` picks
    and orders them; ``disabled=[...]`` switches some off (ablations). Names are checked
    here, at construction, so a typo fails before any graph is built."""

    def __init__(self, passes: Sequence[str] | None = None, disabled: Iterable[str] = (), *,
                 options: Mapping[str, Any] | None = None, track_critical_path: bool = True) -> None:
        chosen = _resolve(DEFAULT_ORDER if passes is None else passes, "passes")
        off = set(_resolve(disabled, "disabled"))
        self.passes: list[Pass] = [PASSES[n] for n in chosen if n not in off]
        self.options = dict(options or {})
        self.track_critical_path = track_critical_path

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def __repr__(self) -> str:
        return f"PassManager({self.names})"

    def run(self, graph: PGraph, cost_model: CostModel | None = None) -> PGraph:
        """A new, optimized graph; ``graph`` is left untouched. ``result.history`` holds one
        :class:`PassRecord` per pass and ``result.explain()`` puts them in words."""
        # A run allocates many small, acyclic objects; the cyclic collector's passes over
        # them were a fifth of the time on 1,000-primitive graphs and find nothing to free.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(graph, cost_model)
        finally:
            if collecting:
                gc.enable()

    def _run(self, graph: PGraph, cost_model: CostModel | None) -> PGraph:
        # One context for the whole run: node costs and finish times are shared between the
        # passes that need them (and the records' critical paths, if anybody reads them).
        ctx = PassContext(cost_model or CostModel.default(), self.options)
        critical_path = _CriticalPaths(ctx) if self.track_critical_path else None
        graph.validate()
        steps: list[tuple[str, PGraph]] = []  # (pass, its result), for naming a pass that broke the graph
        records: list[PassRecord] = []
        current = graph
        for p in self.passes:
            ctx.notes = []
            try:
                with current.frozen():  # a pass that edits its input instead of a copy fails here
                    result = p.run(current, ctx)
            except Exception as exc:
                if current is not graph:  # an earlier pass may have handed it a broken graph: name that one
                    _validate(graph, current, steps)
                exc.add_note(f"in optimizer pass {p.name!r}")
                raise
            records.append(PassRecord(p.name, p.description, "; ".join(ctx.notes), before=current, after=result,
                                      critical_path=critical_path))
            steps.append((p.name, result))
            current = result
        if current is not graph:
            _validate(graph, current, steps)
        if current is graph:
            current = graph.copy()
        current.history = list(graph.history) + records
        return current


def _validate(graph: PGraph, result: PGraph, steps: list[tuple[str, PGraph]]) -> None:
    """Check what the passes edited, once (primitives are immutable, so that is every node
    not shared with the input); if it is broken, find the first pass whose result was."""
    try:
        result.validate(since=graph)
        return
    except GraphValidationError:
        pass
    before = graph
    for name, after in steps:
        if after is not before:
            try:
                after.validate(since=before)
            except GraphValidationError as exc:
                raise GraphValidationError(f"optimizer pass {name!r} produced an invalid graph: {exc}",
                                           node=exc.node) from exc
        before = after
    result.validate()  # not reached when a pass is to blame: the checks above cover every edit


class _CriticalPaths:
    """A run's critical path of any of its graphs, on first request (``explain()``)."""

    def __init__(self, ctx: PassContext) -> None:
        self.ctx = ctx
        self.memo: dict[int, tuple[PGraph, float]] = {}

    def __call__(self, graph: PGraph) -> float:
        known = self.memo.get(id(graph))
        if known is None or known[0] is not graph:
            known = self.memo[id(graph)] = (graph, self.ctx.critical_path_length(graph))
        return known[1]
