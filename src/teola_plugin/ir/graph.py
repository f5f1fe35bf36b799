"""PGraph: a dataflow graph of primitives, with a small torch.fx-style builder.

    g = PGraph()
    q = g.input("question", PortType.TEXT)
    batch = g.add(Op.AGGREGATE, inputs={"in0": q}, attrs={"mode": "list"})
    e = g.add(Op.EMBED, inputs={"texts": batch.out()})
    g.output("vectors", e.out("vectors"))

The primitives are the single source of truth: each names its data inputs (``Ref``) and
its control dependencies (``after``). The graph adds what queries need to be cheap: a
reverse index (who reads each output, who waits on each node), so consumers, rewiring
and removal cost O(degree), and cached predecessor lists and a deterministic
topological order (ties broken by insertion order). ``to_networkx()`` exports a
``networkx.MultiDiGraph`` for everything else.

References may point forward, to a node added later: lowering can emit in any order,
and :meth:`validate` reports whatever is still dangling.

Primitives are immutable and shared between a graph and its copies; edits go through
the graph (``set_input``, ``set_after``, ``set_attrs``, ``replace_uses``, ``remove``),
which swaps in a new primitive. A frozen graph (what the pass manager hands a pass)
refuses edits: a pass must ``copy()`` first, so passes are pure by construction.
"""

from __future__ import annotations

import contextlib
import heapq
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Mapping

from ..errors import GraphValidationError
from . import analysis, history, render, validate as _validate
from .multiindex import MultiIndex
from .node import INPUT, RESERVED, FrozenDict, Primitive, Ref
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
        # Reverse index: who reads each value, who waits on each node, which outputs name a value.
        self._users = MultiIndex()  # Ref -> (consumer, port)
        self._followers = MultiIndex()  # node -> nodes that list it in `after`
        self._exported = MultiIndex()  # Ref -> graph output names
        self._preds: dict[str, tuple[str, ...]] = {}  # cache, filled on demand
        self._order: list[str] | None = None  # cache
        self._order_has_removed = False
        self._forward: set[str] = set()  # names referenced before they were added
        self._moved: dict[Ref, Ref] = {}  # values a rewrite moved (replace_uses): old -> new
        self._frozen = False
        self._valid = False  # passed validate() and not edited since
        self.history: list[PassRecord] = []

    # -- builder -------------------------------------------------------------------------
    def input(self, name: str, type: PortType = PortType.ANY) -> Ref:
        """Declare a graph input; returns ``Ref("input", name)``."""
        self._check_mutable()
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
        """Append a primitive. ``name`` defaults to the op name made unique (embed, embed_1...);
        ``engine`` to the op's engine kind; ``outputs`` is given only for opaque primitives."""
        self._check_mutable()
        parsed = op if type(op) is Op else parse_op(op)
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
            outs = spec.output_names
            if outputs is not None and tuple(outputs) != outs:
                raise GraphValidationError(
                    f"primitive {name!r}: {parsed} has fixed outputs {list(outs)}", node=name)
        prim = Primitive(
            name=name, op=parsed, engine=engine or spec.engine,
            inputs=inputs if type(inputs) is FrozenDict else FrozenDict(inputs or {}),
            attrs=attrs if type(attrs) is FrozenDict else FrozenDict(attrs or {}), origin=origin, outputs=outs,
            after=frozenset(a.name if isinstance(a, Primitive) else a for a in after) if after else frozenset())
        self._prims[name] = prim
        self._seq[name] = self._next_seq
        self._next_seq += 1
        self._link(prim)
        if name in self._forward:  # nodes that referred to `name` before it existed gain an edge
            self._forward.discard(name)
            for port in outs:
                for consumer, _ in self._users.get(Ref(name, port), ()):
                    self._preds.pop(consumer, None)
            for follower in self._followers.get(name, ()):
                self._preds.pop(follower, None)
        self._order = None
        return prim

    def output(self, name: str, ref: Ref) -> None:
        """Declare (or rebind) graph output ``name``."""
        self._check_mutable()
        if name in self._outputs:
            self._exported.discard(self._outputs[name], name)
        self._outputs[name] = ref
        self._exported.add(ref, name)

    def ref(self, node: str, port: str) -> Ref:
        return Ref(INPUT, port) if node == INPUT else self[node].out(port)

    def unique_name(self, base: str) -> str:
        """``base`` if free, else ``base_1``, ``base_2``, ... (never a reserved name)."""
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

    # -- editing (the only way to change structure, so the index stays right) ------------
    def set_input(self, name: str, port: str, ref: Ref) -> None:
        prim = self[name]
        self._replace(prim, inputs=FrozenDict({**prim.inputs, port: ref}))

    def set_after(self, name: str, targets: Iterable[str]) -> None:
        self._replace(self[name], after=frozenset(targets))

    def add_after(self, name: str, *targets: str) -> None:
        self.set_after(name, self[name].after | set(targets))

    def set_attrs(self, name: str, **changes: Any) -> None:
        """Merge ``changes`` into the attrs of ``name``."""
        prim = self[name]
        self._replace(prim, attrs=FrozenDict({**prim.attrs, **changes}))

    def update(self, name: str, *, engine: str | None = None, origin: str | None = None) -> None:
        """Reassign a primitive's engine instance or origin."""
        prim = self[name]
        self._replace(prim, engine=engine if engine is not None else prim.engine,
                      origin=origin if origin is not None else prim.origin)

    def replace_uses(self, old: Ref, new: Ref, *, exclude: Collection[str] = ()) -> int:
        """Rebind every reader of ``old`` (and every graph output) to ``new``; returns how many.

        ``new.node`` itself and the nodes in ``exclude`` keep reading ``old``, so inserting a
        node after ``old`` and redirecting its readers cannot create a self-loop.
        """
        self._check_mutable()
        count = 0
        for consumer, port in list(self._users.get(old, ())):
            if consumer != new.node and consumer not in exclude:
                self.set_input(consumer, port, new)
                count += 1
        for out_name in list(self._exported.get(old, ())):
            self.output(out_name, new)
            count += 1
        if old != new:
            self._moved[old] = new
        return count

    def mark(self) -> int:
        """A point in the graph's history of additions (see :meth:`added_since`)."""
        return self._next_seq

    def added_since(self, mark: int) -> list[str]:
        """The nodes added after :meth:`mark` returned ``mark`` (still in the graph), in order."""
        return [name for name, seq in self._seq.items() if seq >= mark]

    def where_is(self, ref: Ref) -> Ref | None:
        """Where the value ``ref`` named before the rewrites (``replace_uses``) is computed in
        this graph: ``ref`` itself, the ref it was moved to (a duplicate merged away, a stage's
        shards gathered), or None when no node computes it any more (dead code removed)."""
        seen = set()
        while ref in self._moved and ref not in seen:
            seen.add(ref)
            ref = self._moved[ref]
        return ref if ref.node == INPUT and ref.port in self._inputs or ref.node in self._prims else None

    def remove(self, name: str) -> None:
        """Delete a node nobody reads or waits on (rewire its users first)."""
        self._check_mutable()
        prim = self[name]
        refs = [Ref(name, port) for port in prim.outputs]
        users = [c for ref in refs for c, _ in self._users.get(ref, ())]
        users += [f"{o} (graph output)" for ref in refs for o in self._exported.get(ref, ())]
        users += [f"{f} (after)" for f in self._followers.get(name, ())]
        if users:
            raise GraphValidationError(
                f"cannot remove {prim.describe()}: still used by {', '.join(dict.fromkeys(users))}",
                node=name)
        self._unlink(prim)
        del self._prims[name], self._seq[name]
        for port in prim.outputs:
            self._users.pop(Ref(name, port))
        self._followers.pop(name)
        self._preds.pop(name, None)
        self._order_has_removed = True  # still a valid order once the name is filtered out

    def copy(self) -> PGraph:
        """An independent, editable graph sharing the (immutable) primitives."""
        g = PGraph.__new__(PGraph)
        g.name = self.name
        g._prims = dict(self._prims)
        g._seq = dict(self._seq)
        g._next_seq = self._next_seq
        g._counts = dict(self._counts)
        g._inputs = dict(self._inputs)
        g._outputs = dict(self._outputs)
        g._users = self._users.copy()
        g._followers = self._followers.copy()
        g._exported = self._exported.copy()
        g._preds = dict(self._preds)
        g._order = self._order  # never mutated in place, only replaced
        g._order_has_removed = self._order_has_removed
        g._forward = set(self._forward)
        g._moved = dict(self._moved)
        g._frozen = False
        g._valid = self._valid
        g.history = list(self.history)
        return g

    @contextlib.contextmanager
    def frozen(self) -> Iterator[PGraph]:
        """Refuse edits inside the block (a pass that forgets to copy fails loudly)."""
        was, self._frozen = self._frozen, True
        try:
            yield self
        finally:
            self._frozen = was

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
        prims = self._prims
        return [prims[n] for n in self.topological_order()]

    @property
    def inputs(self) -> Mapping[str, PortType]:
        return MappingProxyType(self._inputs)

    @property
    def outputs(self) -> Mapping[str, Ref]:
        return MappingProxyType(self._outputs)

    def uses(self, ref: Ref) -> list[_Use]:
        """``(consumer, port)`` pairs that read ``ref``."""
        return list(self._users.get(ref, ()))

    def type_of(self, ref: Ref) -> PortType | None:
        """Type of the value ``ref`` names; ``None`` if it names nothing."""
        if ref.node == INPUT:
            return self._inputs.get(ref.port)
        prim = self._prims.get(ref.node)
        return prim.output_type(ref.port) if prim is not None else None

    def is_output(self, ref: Ref) -> bool:
        """Is ``ref`` a graph output?"""
        return bool(self._exported.get(ref))

    def consumers(self, name: str) -> list[str]:
        """Nodes that read any output of ``name`` (data edges)."""
        users = self._users
        return list(dict.fromkeys(c for port in self[name].outputs for c, _ in users.get(Ref(name, port), ())))

    def followers(self, name: str) -> list[str]:
        """Nodes that list ``name`` in their ``after`` (control edges)."""
        return list(self._followers.get(name, ()))

    def producers(self, name: str) -> list[str]:
        """Primitives whose outputs ``name`` reads (data edges; graph inputs excluded)."""
        return list(dict.fromkeys(r.node for r in self[name].inputs.values() if r.node in self._prims))

    def predecessors(self, name: str) -> tuple[str, ...]:
        """Data producers, then control dependencies (sorted), that exist in the graph."""
        preds = self._preds.get(name)
        if preds is None:  # hot in every analysis: kept free of generators
            prim, prims = self[name], self._prims
            found = [r.node for r in prim.inputs.values() if r.node in prims]
            if prim.after:
                found += sorted(a for a in prim.after if a in prims)
            preds = self._preds[name] = tuple(dict.fromkeys(found)) if len(found) > 1 else tuple(found)
        return preds

    def successors(self, name: str) -> list[str]:
        succ = dict.fromkeys(self.consumers(name))
        succ.update(dict.fromkeys(self._followers.get(name, ())))
        return list(succ)

    def topological_order(self) -> list[str]:
        """Names in a deterministic topological order (a cached list: do not modify it).

        Computed with ties broken by insertion order; edits that only drop edges or nodes
        keep the cached order, which stays valid."""
        if self._order is None:
            self._order = self._toposort()
        elif self._order_has_removed:
            self._order = [n for n in self._order if n in self._prims]
        self._order_has_removed = False
        return self._order

    # -- analysis, export, explanation (each in its own module) --------------------------
    def validate(self, *, since: PGraph | None = None) -> None:
        """Raise :class:`GraphValidationError` naming the first offending node. With
        ``since`` (a graph this one was copied and edited from), check only what the edits
        touched, plus outputs and cycles: edits through this API cannot break the rest.
        A graph that passed and was not edited since is not checked again (a tracer validates
        what it built; the optimizer validates its input)."""
        if self._valid:
            return
        if since is None:
            _validate.validate(self)
            self._valid = True
        else:
            _validate.validate(self, only=self.edited_since(since), previous=since._prims)
            self._valid = since._valid

    def edited_since(self, other: PGraph) -> list[str]:
        """Names of primitives added or replaced since ``other`` (a graph this one was
        copied from): primitives are immutable, so this is an identity check per node."""
        theirs = other._prims
        return [n for n, prim in self._prims.items() if theirs.get(n) is not prim]

    def depth(self) -> tuple[dict[str, int], int]:
        """(level of each node, number of levels); level 0 has no predecessors."""
        return analysis.depth(self)

    def critical_path(self, cost_model: CostFn) -> tuple[float, list[str]]:
        """(seconds, node names) of the longest path, with unlimited engines; ``cost_model``
        has ``node_cost(prim)`` or is a callable ``prim -> seconds``."""
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
    def _check_mutable(self) -> None:
        """Every edit goes through here: refuse it on a frozen graph, else forget the last
        validation."""
        if self._frozen:
            raise RuntimeError(f"PGraph {self.name!r} is frozen (an optimizer pass must copy() "
                               "its input before editing)")
        self._valid = False

    def _replace(self, prim: Primitive, **changes: Any) -> None:
        self._check_mutable()
        new = Primitive(prim.name, prim.op, changes.get("engine", prim.engine),
                        changes.get("inputs", prim.inputs), changes.get("attrs", prim.attrs),
                        changes.get("after", prim.after), changes.get("origin", prim.origin),
                        prim.outputs)
        if new.inputs is not prim.inputs:
            for port, ref in prim.inputs.items():
                self._users.discard(ref, (prim.name, port))
            for port, ref in new.inputs.items():
                self._users.add(ref, (prim.name, port))
                if ref.node not in self._prims and ref.node != INPUT:
                    self._forward.add(ref.node)
        if new.after != prim.after:
            for target in prim.after - new.after:
                self._followers.discard(target, prim.name)
            for target in new.after - prim.after:
                self._followers.add(target, prim.name)
                if target not in self._prims:
                    self._forward.add(target)
        if new.inputs is not prim.inputs or new.after != prim.after:
            self._preds.pop(prim.name, None)
            if new.inputs is not prim.inputs or not new.after <= prim.after:
                self._order = None  # dropping edges keeps any topological order valid
        self._prims[prim.name] = new

    def _link(self, prim: Primitive) -> None:
        prims = self._prims
        for port, ref in prim.inputs.items():
            self._users.add(ref, (prim.name, port))
            if ref.node not in prims and ref.node != INPUT:
                self._forward.add(ref.node)
        for target in prim.after:
            self._followers.add(target, prim.name)
            if target not in prims:
                self._forward.add(target)

    def _unlink(self, prim: Primitive) -> None:
        for port, ref in prim.inputs.items():
            self._users.discard(ref, (prim.name, port))
        for target in prim.after:
            self._followers.discard(target, prim.name)

    def _toposort(self) -> list[str]:
        cached, compute = self._preds, self.predecessors
        preds = {n: cached[n] if n in cached else compute(n) for n in self._prims}
        succ: dict[str, list[str]] = {n: [] for n in self._prims}
        for n, ps in preds.items():
            for p in ps:
                succ[p].append(n)
        indegree = {n: len(ps) for n, ps in preds.items()}
        seq = self._seq
        ready = [(seq[n], n) for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for s in succ[name]:
                indegree[s] -= 1
                if indegree[s] == 0:
                    heapq.heappush(ready, (seq[s], s))
        if len(order) < len(self._prims):
            cycle = analysis.find_cycle(self, [n for n, d in indegree.items() if d > 0])
            raise GraphValidationError(
                f"cycle through {' -> '.join(cycle + cycle[:1])}: a primitive cannot wait on itself",
                node=cycle[0])
        return order

