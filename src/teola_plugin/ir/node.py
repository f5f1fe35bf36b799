"""The two atoms of a graph: :class:`Ref` (one output port of one node) and :class:`Primitive`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import GraphValidationError
from .ops import Op, OpSpec, OPS
from .ports import PortType

INPUT = "input"  # graph inputs are Ref(INPUT, name)
OUTPUT = "output"  # reserved: graph outputs are named, not nodes
RESERVED = frozenset({INPUT, OUTPUT})


@dataclass(frozen=True, slots=True)
class Ref:
    """A value: output ``port`` of node ``node`` (or graph input ``port`` when node is "input")."""

    node: str
    port: str

    def __str__(self) -> str:
        return f"{self.node}.{self.port}"


# Fields the owning PGraph indexes; changing them behind its back would desync it.
_STRUCTURE = frozenset({"name", "inputs", "after", "outputs"})


@dataclass(eq=False, repr=False, slots=True)
class Primitive:
    """One node: an op run by an engine on named input ports.

    ``inputs``, ``after`` and ``outputs`` are read-only here; change them through
    :class:`~teola_plugin.ir.graph.PGraph` (``set_input``, ``set_after``, ``replace_uses``),
    which keeps its use index consistent. ``attrs``, ``engine`` and ``origin`` are free to edit.
    """

    name: str
    op: Op
    engine: str  # engine *instance* name; defaults to the op's engine kind
    inputs: Mapping[str, Ref]
    attrs: dict[str, Any]
    after: frozenset[str]  # control dependencies: run only after these nodes finished
    origin: str  # the framework component this was traced from, for errors and explain()
    outputs: tuple[str, ...]

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _STRUCTURE:
            try:
                getattr(self, key)
            except AttributeError:  # first assignment, from __init__
                pass
            else:
                raise AttributeError(f"Primitive.{key} is owned by its PGraph; use PGraph.set_input / "
                                     "set_after / replace_uses instead")
        object.__setattr__(self, key, value)

    # -- what the spec says --------------------------------------------------------------
    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def kind(self) -> str:
        """Engine kind (cpu, embedder, vector_store, reranker, search, llm)."""
        return self.spec.engine

    @property
    def pure(self) -> bool:
        if self.spec.variadic_outputs:  # opaque: impure unless the lowering vouched for it
            return self.attrs.get("pure") is True
        return self.spec.pure

    def input_type(self, port: str) -> PortType | None:
        return self.spec.input_type(port)

    def output_type(self, port: str) -> PortType | None:
        return self.spec.output_type(port) if port in self.outputs else None

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
        """``name (op, traced from Origin)``: how errors and explanations name a node."""
        origin = f", traced from {self.origin}" if self.origin else ""
        return f"primitive {self.name!r} ({self.op}{origin})"

    def __repr__(self) -> str:
        ins = ", ".join(f"{p}={r}" for p, r in self.inputs.items())
        after = f", after={sorted(self.after)}" if self.after else ""
        return f"<{self.name} = {self.op}@{self.engine}({ins}){after}>"
