"""PGraph: a dataflow graph of primitives, with a small torch.fx-style builder.

    g = PGraph()
    q = g.input("question", PortType.TEXT)
    e = g.add(Op.EMBED, inputs={"texts": ...})
    g.output("vectors", e.out("vectors"))

The primitives are the single source of truth: each one names its data inputs (``Ref``)
and its control dependencies (``after``). The graph keeps the reverse index (who reads
each output, who waits on each node) so consumers, replacement and removal cost O(degree),
and caches a deterministic topological order (ties broken by insertion order).
``to_networkx()`` exports a ``networkx.MultiDiGraph`` for anything else.

References may point forward (to a node added later): lowering rules can emit in any
order, and :meth:`validate` reports whatever is still dangling.
"""

from __future__ import annotations

import heapq
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Iterator, Mapping

from ..errors import GraphValidationError
from . import analysis, history, render, validate as _validate
from .node import INPUT, OUTPUT, RESERVED, Primitive, Ref
from .ops import OPS, Op, parse_op
from .ports import PortType

if TYPE_CHECKING:
    import networkx as nx

    from .analysis import CostFn
    from .history import PassRecord

_Use = tuple[str, str]  # (consumer name, consumer input port)


class PGraph:
    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self._prims: dict[str, Primitive] = {}
        self._seq: dict[str, int] = {}  # insertion index: the topological tie-breaker
        self._next_seq = 0
        self._counts: dict[str, int] = {}  # per base name, for auto names embed, embed_1, ...
        self._inputs: dict[str, PortType] = {}
        self._outputs: dict[str, Ref] = {}
        # Reverse index. Dicts used as ordered sets so iteration order is deterministic.
        self._users: dict[str, dict[str, dict[_Use, None]]] = {}  # producer -> port -> uses
        self._followers: dict[str, dict[str, None]] = {}  # node -> nodes with it in `after`
        self._order: list[str] | None = None
        self.history: list[PassRecord] = []

    # -- builder -------------------------------------------------------------------------
    def input(self, name: str, type: PortType = PortType.ANY) -> Ref:
        """Declare a graph input; returns ``Ref("input", name)``."""
        if name in self._inputs:
            raise GraphValidationError(f"graph input {name!r} declared twice", node=INPUT)
        self._inputs[name] = PortType(type)
        return Ref(INPUT, name)

    def add(
        self,
        op: Op | str,
        name: str | None = None,
        inputs: Mapping[str, Ref] | None = None,
        attrs: Mapping[str, Any] | None = None,
        engine: str | None = None,
        origin: str = "",
        after: Iterable[str | Primitive] = (),
        outputs: Iterable[str] | None = None,
    ) -> Primitive:
        """Append a primitive. ``name`` defaults to the op name made unique (embed, embed_1...)."""
        parsed = parse_op(op)
        if name is None:
            name = self.unique_name(parsed.value if parsed else str(op))
        elif name in self._prims or name in RESERVED:
            raise GraphValidationError(f"node name {name!r} is already taken or reserved", node=name)
        if parsed is None:
            raise GraphValidationError(
                f"primitive {name!r}: unknown op {op!r} (known: {', '.join(o.value for o in Op)})",
                node=name)
        spec = OPS[parsed]
        if spec.variadic_outputs:
            outs = tuple(outputs) if outputs is not None else ("out",)
        else:
            outs = tuple(spec.outputs)
            if outputs is not None and tuple(outputs) != outs:
                raise GraphValidationError(
                    f"primitive {name!r}: {parsed} has fixed outputs {list(outs)}", node=name)
        prim = Primitive(
            name=name, op=parsed, engine=engine or spec.engine,
            inputs=MappingProxyType(dict(inputs or {})), attrs=dict(attrs or {}),
            after=frozenset(a.name if isinstance(a, Primitive) else a for a in after),
            origin=origin, outputs=outs)
        self._prims[name] = prim
        self._seq[name] = self._next_seq
        self._next_seq += 1
        self._link(prim)
        self._order = None
        return prim

    def output(self, name: str, ref: Ref) -> None:
        """Declare (or rebind) graph output ``name``."""
        self._outputs[name] = ref

    def ref(self, node: str, port: str) -> Ref:
        if node == INPUT:
            return Ref(INPUT, port)
        return self[node].out(port)

    def unique_name(self, base: str) -> str:
        if base not in self._prims and base not in RESERVED and base not in self._counts:
            self._counts[base] = 0
            return base
        i = self._counts.get(base, 0)
        while True:
            i += 1
            candidate = f"{base}_{i}"
            if candidate not in self._prims:
                self._counts[base] = i
                return candidate

    # -- mutation (the only way to change structure, so the index stays right) -----------
    def set_input(self, name: str, port: str, ref: Ref) -> None:
        prim = self[name]
        self._unlink(prim)
        new = dict(prim.inputs)
        new[port] = ref
        object.__setattr__(prim, "inputs", MappingProxyType(new))
        self._link(prim)
        self._order = None

    def set_after(self, name: str, targets: Iterable[str]) -> None:
        prim = self[name]
        self._unlink(prim)
        object.__setattr__(prim, "after", frozenset(targets))
        self._link(prim)
        self._order = None

    def add_after(self, name: str, *targets: str) -> None:
        self.set_after(name, self[name].after | set(targets))

    def replace_uses(self, old: Ref, new: Ref, *, exclude: Collection[str] = ()) -> int:
        """Rebind every reader of ``old`` (and graph outputs) to ``new``; returns how many.

        ``new.node`` itself and the nodes in ``exclude`` keep reading ``old``, so inserting a
        node after ``old`` and redirecting its readers cannot create a self-loop.
        """
        count = 0
        for consumer, port in list(self._users.get(old.node, {}).get(old.port, {})):
            if consumer != new.node and consumer not in exclude:
                self.set_input(consumer, port, new)
                count += 1
        for out_name, ref in self._outputs.items():
            if ref == old:
                self._outputs[out_name] = new
                count += 1
        return count

    def remove(self, name: str) -> None:
        """Delete a node nobody reads or waits on (rewire its users first)."""
        prim = self[name]
        users = [c for uses in self._users.get(name, {}).values() for c, _ in uses]
        users += [f"{o} (graph output)" for o, r in self._outputs.items() if r.node == name]
        users += [f"{f} (after)" for f in self._followers.get(name, {})]
        if users:
            raise GraphValidationError(
                f"cannot remove {prim.describe()}: still used by {', '.join(dict.fromkeys(users))}",
                node=name)
        self._unlink(prim)
        del self._prims[name], self._seq[name]
        self._users.pop(name, None)
        self._followers.pop(name, None)
        self._order = None

    def copy(self) -> PGraph:
        """An independent graph: passes copy, then edit, so their input is never mutated."""
        g = PGraph.__new__(PGraph)
        g.name = self.name
        g._prims = {
            n: Primitive(p.name, p.op, p.engine, p.inputs, _copy_value(p.attrs), p.after, p.origin,
                         p.outputs)
            for n, p in self._prims.items()
        }  # inputs / after / outputs are immutable, so sharing them is safe
        g._seq = dict(self._seq)
        g._next_seq = self._next_seq
        g._counts = dict(self._counts)
        g._inputs = dict(self._inputs)
        g._outputs = dict(self._outputs)
        g._users = {n: {p: dict(u) for p, u in ports.items()} for n, ports in self._users.items()}
        g._followers = {n: dict(f) for n, f in self._followers.items()}
        g._order = list(self._order) if self._order is not None else None
        g.history = list(self.history)
        return g

    # -- queries -------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Primitive:
        try:
            return self._prims[name]
        except KeyError:
            raise KeyError(f"no primitive named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._prims

    def __len__(self) -> int:
        return len(self._prims)

    def __iter__(self) -> Iterator[Primitive]:
        return iter(self.nodes)

    @property
    def nodes(self) -> list[Primitive]:
        """All primitives in topological order (data and control edges; ties by insertion)."""
        return [self._prims[n] for n in self.topological_order()]

    @property
    def inputs(self) -> Mapping[str, PortType]:
        return MappingProxyType(self._inputs)

    @property
    def outputs(self) -> Mapping[str, Ref]:
        return MappingProxyType(self._outputs)

    def uses(self, ref: Ref) -> list[_Use]:
        """``(consumer, port)`` pairs reading ``ref``."""
        return list(self._users.get(ref.node, {}).get(ref.port, {}))

    def consumers(self, name: str) -> list[str]:
        """Nodes that read any output of ``name`` (data edges)."""
        return list(dict.fromkeys(c for uses in self._users.get(name, {}).values() for c, _ in uses))

    def followers(self, name: str) -> list[str]:
        """Nodes that list ``name`` in their ``after`` (control edges)."""
        return list(self._followers.get(name, {}))

    def producers(self, name: str) -> list[str]:
        """Primitives whose outputs ``name`` reads (data edges; graph inputs excluded)."""
        return list(dict.fromkeys(r.node for r in self[name].inputs.values() if r.node in self._prims))

    def predecessors(self, name: str) -> list[str]:
        """Data producers and control dependencies that exist in the graph."""
        prim = self[name]
        preds = dict.fromkeys(r.node for r in prim.inputs.values() if r.node in self._prims)
        preds.update(dict.fromkeys(a for a in sorted(prim.after) if a in self._prims))
        return list(preds)

    def successors(self, name: str) -> list[str]:
        succ = dict.fromkeys(self.consumers(name))
        succ.update(self._followers.get(name, {}))
        return list(succ)

    def topological_order(self) -> list[str]:
        if self._order is None:
            self._order = self._toposort()
        return list(self._order)

    # -- analysis, export, explanation (each in its own module) --------------------------
    def validate(self) -> None:
        """Raise :class:`GraphValidationError` naming the first offending node."""
        _validate.validate(self)

    def depth(self) -> tuple[dict[str, int], int]:
        """(level of each node, number of levels); level 0 has no predecessors."""
        return analysis.depth(self)

    def critical_path(self, cost_model: CostFn) -> tuple[float, list[str]]:
        """(seconds, node names) of the longest path; ``cost_model`` has ``node_cost(prim)``
        or is a callable ``prim -> seconds``."""
        return analysis.critical_path(self, cost_model)

    def to_mermaid(self) -> str:
        return render.to_mermaid(self)

    def to_dot(self) -> str:
        return render.to_dot(self)

    def summary(self) -> str:
        return render.summary(self)

    def explain(self) -> str:
        """What each optimizer pass changed, in words, and the critical path before / after."""
        return history.explain(self)

    def to_networkx(self) -> nx.MultiDiGraph:
        return analysis.to_networkx(self)

    def __repr__(self) -> str:
        return f"<PGraph {self.name!r}: {len(self._prims)} primitives, outputs {list(self._outputs)}>"

    # -- internals -----------------------------------------------------------------------
    def _link(self, prim: Primitive) -> None:
        for port, ref in prim.inputs.items():
            self._users.setdefault(ref.node, {}).setdefault(ref.port, {})[(prim.name, port)] = None
        for target in prim.after:
            self._followers.setdefault(target, {})[prim.name] = None

    def _unlink(self, prim: Primitive) -> None:
        for port, ref in prim.inputs.items():
            ports = self._users.get(ref.node)
            if ports is not None:
                ports.get(ref.port, {}).pop((prim.name, port), None)
        for target in prim.after:
            self._followers.get(target, {}).pop(prim.name, None)

    def _toposort(self) -> list[str]:
        indegree = {n: len(self.predecessors(n)) for n in self._prims}
        ready = [(self._seq[n], n) for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for succ in self.successors(name):
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    heapq.heappush(ready, (self._seq[succ], succ))
        if len(order) < len(self._prims):
            cycle = analysis.find_cycle(self, [n for n, d in indegree.items() if d > 0])
            raise GraphValidationError(
                f"cycle through {' -> '.join(cycle + cycle[:1])}: a primitive cannot wait on itself",
                node=cycle[0])
        return order


def _copy_value(value: Any) -> Any:
    """Copy nested dicts / lists / sets (attrs); leave everything else shared. Much cheaper
    than deepcopy, and attrs hold only such containers plus immutable leaves."""
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    if isinstance(value, set):
        return set(value)
    return value


