"""What each optimizer pass did to a graph: :class:`PassRecord` and :func:`explain`.

Records are computed generically by comparing the graph before and after a pass, so a
pass cannot forget to report a change; the pass only adds a note saying *why*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, NamedTuple

from .node import Primitive

if TYPE_CHECKING:
    from .graph import PGraph


class Edge(NamedTuple):
    src: str
    dst: str
    kind: str  # "data" or "control"
    src_port: str = ""
    dst_port: str = ""

    def __str__(self) -> str:
        if self.kind == "control":
            return f"{self.dst} after {self.src}"
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


@dataclass(frozen=True)
class Changes:
    """Everything that differs between the graphs before and after a pass."""

    added_nodes: tuple[str, ...] = ()
    removed_nodes: tuple[str, ...] = ()
    changed_nodes: tuple[str, ...] = ()  # same name, different attrs / engine / origin
    added_edges: tuple[Edge, ...] = ()
    removed_edges: tuple[Edge, ...] = ()
    rebound_outputs: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.added_nodes or self.removed_nodes or self.changed_nodes or self.added_edges
                    or self.removed_edges or self.rebound_outputs)


class PassRecord:
    """What one optimizer pass did: its name, why (``note``), its :class:`Changes` (whose
    fields read through: ``record.added_nodes``, ``record.changed``) and the critical path
    before and after it.

    Changes and critical paths are computed on first read from the graphs before and after
    the pass, which the record holds until then: an optimizer run whose history nobody
    reads (a query's) pays nothing for it."""

    def __init__(self, pass_name: str, description: str = "", note: str = "", *,
                 before: PGraph, after: PGraph, critical_path: Callable[[PGraph], float] | None = None) -> None:
        self.pass_name, self.description, self.note = pass_name, description, note
        self._graphs: tuple[PGraph, PGraph] | None = (before, after)
        self._critical_path = critical_path
        self._changes: Changes | None = None
        self._spans: tuple[float, float] | None = None

    @property
    def changes(self) -> Changes:
        if self._changes is None:
            assert self._graphs is not None
            self._changes = diff(*self._graphs)
            self._release()
        return self._changes

    @property
    def critical_path_before(self) -> float | None:
        span = self._span()
        return None if span is None else span[0]

    @property
    def critical_path_after(self) -> float | None:
        span = self._span()
        return None if span is None else span[1]

    def _span(self) -> tuple[float, float] | None:
        if self._spans is None and self._critical_path is not None and self._graphs is not None:
            before, after = self._graphs
            self._spans = (self._critical_path(before), self._critical_path(after))
            self._critical_path = None  # its memo holds the run's graphs
            self._release()
        return self._spans

    def _release(self) -> None:
        """Drop the graphs once everything read from them is computed."""
        if self._changes is not None and (self._critical_path is None or self._spans is not None):
            self._graphs = None

    def __getattr__(self, name: str) -> object:  # the Changes' fields and ``changed``
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.changes, name)

    def __repr__(self) -> str:
        return f"PassRecord({self.pass_name!r}, changed={self.changed})"


def _edges(prim: Primitive) -> Iterable[Edge]:
    for port, ref in prim.inputs.items():
        yield Edge(ref.node, prim.name, "data", ref.port, port)
    for target in prim.after:
        yield Edge(target, prim.name, "control")


def diff(before: PGraph, after: PGraph) -> Changes:
    """Everything that differs between two graphs. O(n): nodes are compared by name,
    edges only for nodes whose inputs / after changed."""
    old, new = before._prims, after._prims
    added = [n for n in new if n not in old]
    removed = [n for n in old if n not in new]
    changed: list[str] = []
    added_edges: set[Edge] = {e for n in added for e in _edges(new[n])}
    removed_edges: set[Edge] = {e for n in removed for e in _edges(old[n])}
    for name, q in new.items():
        p = old.get(name)
        if p is None or p is q:
            continue
        if p.inputs != q.inputs or p.after != q.after:
            e_old, e_new = set(_edges(p)), set(_edges(q))
            added_edges |= e_new - e_old
            removed_edges |= e_old - e_new
        if p.attrs != q.attrs or p.engine != q.engine or p.origin != q.origin or p.op != q.op:
            changed.append(name)
    rebound = [o for o, r in after.outputs.items() if before.outputs.get(o) != r]
    return Changes(tuple(added), tuple(removed), tuple(changed), tuple(sorted(added_edges)),
                   tuple(sorted(removed_edges)), tuple(rebound))


def _names(names: Iterable[str], graph: PGraph | None = None, limit: int = 8) -> str:
    names = list(names)
    shown = [f"{n} ({graph[n].op})" if graph is not None and n in graph else n for n in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


def describe(record: PassRecord, graph: PGraph | None = None) -> list[str]:
    """The record in words, one line per kind of change."""
    if not record.changed:
        return ["no change"]
    lines: list[str] = []
    touched = set(record.added_nodes) | set(record.removed_nodes)
    # Edges of added / removed nodes are implied by those nodes; report edits to the others.
    edits = lambda edges, kind: [e for e in edges if e.kind == kind and e.dst not in touched]  # noqa: E731
    if record.added_nodes:
        lines.append(f"added {_names(record.added_nodes, graph)}")
    if record.removed_nodes:
        lines.append(f"removed {_names(record.removed_nodes)}")
    if dropped := edits(record.removed_edges, "control"):
        lines.append("dropped control deps: " + _names(f"{e.dst} no longer waits for {e.src}" for e in dropped))
    if kept := edits(record.added_edges, "control"):
        lines.append("added control deps: " + _names(f"{e.dst} waits for {e.src}" for e in kept))
    if rewired := edits(record.added_edges, "data"):
        was_bound = {(e.dst, e.dst_port) for e in record.removed_edges if e.kind == "data"}
        lines.append("rewired: " + _names(
            f"{e.dst}.{e.dst_port} {'now' if (e.dst, e.dst_port) in was_bound else 'newly'} reads "
            f"{e.src}.{e.src_port}" for e in rewired))
    if record.changed_nodes:
        lines.append(f"changed attrs of {_names(record.changed_nodes, graph)}")
    if record.rebound_outputs:
        lines.append(f"graph outputs now read: {_names(record.rebound_outputs)}")
    return lines


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f} s"


def explain(graph: PGraph) -> str:
    if not graph.history:
        return f"PGraph {graph.name!r} has not been optimized (no pass history)."
    first, last = graph.history[0], graph.history[-1]
    out = [f"Optimization of {graph.name!r}: {len(graph.history)} passes, critical path "
           f"{_seconds(first.critical_path_before)} -> {_seconds(last.critical_path_after)}"]
    for i, rec in enumerate(graph.history, 1):
        out.append(f"{i}. {rec.pass_name}: {rec.description}".rstrip(": "))
        if rec.note:
            out.append(f"   why: {rec.note}")
        out.extend(f"   - {line}" for line in describe(rec, graph))
        if rec.critical_path_before is not None:
            out.append(f"   critical path {_seconds(rec.critical_path_before)} -> "
                       f"{_seconds(rec.critical_path_after)}")
    return "\n".join(out) + "\n"
