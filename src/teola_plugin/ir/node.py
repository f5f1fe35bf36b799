"""The two atoms of a graph: :class:`Ref` (one output port of one node) and :class:`Primitive`.

Primitives are immutable. A graph edit replaces the edited primitive with a new one, so
a copied graph shares every primitive it did not change with its original: copying is
cheap, a pass cannot mutate the graph it was given, and comparing before / after a pass
is an identity check per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from ..errors import GraphValidationError
from .ops import Op, OpSpec, OPS
from .ports import PortType

INPUT = "input"  # graph inputs are Ref(INPUT, name)
OUTPUT = "output"  # reserved: graph outputs are named, not nodes
RESERVED = frozenset({INPUT, OUTPUT})


class Ref(NamedTuple):
    """A value: output ``port`` of node ``node`` (or graph input ``port`` when node is "input")."""

    node: str
    port: str

    def __str__(self) -> str:
        return f"{self.node}.{self.port}"


class FrozenDict(dict):
    """A read-only dict (unlike MappingProxyType it pickles, e.g. into a Ray actor)."""

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a primitive's inputs / attrs are read-only; edit them through PGraph "
                        "(set_input, set_attrs, replace_uses) on a copy of the graph")

    __setitem__ = __delitem__ = __ior__ = _readonly  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


@dataclass(frozen=True, slots=True, eq=False)
class Primitive:
    """One node: an op run by an engine on named input ports. Read-only; see module doc."""

    name: str
    op: Op
    engine: str  # engine *instance* name; defaults to the op's engine kind
    inputs: FrozenDict  # port -> Ref
    attrs: FrozenDict  # port-independent parameters: est_items, top_k, parts, shard, ...
    after: frozenset[str]  # control dependencies: run only after these nodes finished
    origin: str  # the framework component this was traced from, for errors and explain()
    outputs: tuple[str, ...]

    # -- what the spec says --------------------------------------------------------------
    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def kind(self) -> str:
        """Engine kind (cpu, embedder, vector_store, reranker, search, llm)."""
        return OPS[self.op].engine

    @property
    def pure(self) -> bool:
        if self.op is Op.OPAQUE:  # impure unless the lowering vouched for it
            return self.attrs.get("pure") is True
        return OPS[self.op].pure

    def input_type(self, port: str) -> PortType | None:
        return OPS[self.op].input_type(port)

    def output_type(self, port: str) -> PortType | None:
        return OPS[self.op].output_type(port) if port in self.outputs else None

    @property
    def shard(self) -> tuple[int, int] | None:
        shard = self.attrs.get("shard")
        return (int(shard[0]), int(shard[1])) if shard else None

    # -- references ----------------------------------------------------------------------
    def out(self, port: str | None = None) -> Ref:
        """Ref to output ``port`` (may be omitted when the primitive has exactly one output)."""
        if port is None:
            if len(self.outputs) != 1:
                raise GraphValidationError(
                    f"{self.describe()} has outputs {list(self.outputs)}; name one", node=self.name)
            port = self.outputs[0]
        if port not in self.outputs:
            raise GraphValidationError(
                f"{self.describe()} has no output port {port!r} (it has {', '.join(self.outputs)})",
                node=self.name)
        return Ref(self.name, port)

    def describe(self) -> str:
        """``primitive 'name' (op, traced from Origin)``: how errors name a node."""
        origin = f", traced from {self.origin}" if self.origin else ""
        return f"primitive {self.name!r} ({self.op}{origin})"

    def __repr__(self) -> str:
        ins = ", ".join(f"{p}={r}" for p, r in self.inputs.items())
        after = f", after={sorted(self.after)}" if self.after else ""
        return f"<{self.name} = {self.op}@{self.engine}({ins}){after}>"
