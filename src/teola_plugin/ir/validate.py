"""Graph well-formedness. Every error names the offending primitive (and its origin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from ..errors import GraphValidationError
from .node import INPUT, Primitive
from .ops import COMMON_ATTRS, Op
from .ports import PortType, compatible
from .semantics import AGGREGATE_MODES, template_vars

if TYPE_CHECKING:
    from .graph import PGraph


def validate(graph: PGraph, only: Iterable[str] | None = None,
             previous: Mapping[str, Primitive] | None = None) -> None:
    """Check every primitive, or just ``only`` (the ones an edit replaced: through the
    PGraph API an edit cannot break a primitive it did not touch, as producers keep their
    op and ports while read), and of those only the parts that differ from ``previous``;
    then the outputs and cycles."""
    prims, previous = graph._prims, previous or {}
    for prim in prims.values() if only is None else (prims[n] for n in only):
        _check_primitive(graph, prim, previous.get(prim.name))
    for name, ref in graph.outputs.items():
        if graph.type_of(ref) is None:
            raise GraphValidationError(
                f"graph output {name!r} refers to {ref}, which does not exist", node=ref.node)
    graph.topological_order()  # raises, naming the nodes on a cycle


def _fail(prim: Primitive, message: str) -> GraphValidationError:
    return GraphValidationError(f"{prim.describe()}: {message}", node=prim.name)


def _check_primitive(graph: PGraph, prim: Primitive, old: Primitive | None = None) -> None:
    if not isinstance(prim.op, Op):
        raise _fail(prim, f"unknown op {prim.op!r}")
    if old is None or old.op is not prim.op or old.inputs is not prim.inputs:
        _check_inputs(graph, prim)
    if old is None or old.after is not prim.after:
        for target in sorted(prim.after):
            if target not in graph._prims:
                raise _fail(prim, f"waits (after) on unknown node {target!r}")
    if old is None or old.attrs is not prim.attrs or old.inputs is not prim.inputs:
        _check_attrs(prim)


def _check_inputs(graph: PGraph, prim: Primitive) -> None:
    spec, prims, graph_inputs = prim.spec, graph._prims, graph._inputs
    for port, ref in prim.inputs.items():
        want = PortType.ANY if spec.variadic_inputs else spec.inputs.get(port)
        if want is None:
            raise _fail(prim, f"{prim.op} has no input port {port!r} (ports: {', '.join(spec.inputs)})")
        producer = prims.get(ref.node)
        have = producer.output_type(ref.port) if producer is not None else graph_inputs.get(ref.port) \
            if ref.node == INPUT else None
        if have is None:
            if ref.node == INPUT:
                what = f"undeclared graph input {ref.port!r}"
            elif ref.node not in graph._prims:
                what = f"non-existent node {ref.node!r}"
            else:
                outs = ", ".join(graph._prims[ref.node].outputs)
                what = f"{ref.node!r}, which has no output port {ref.port!r} (it has {outs})"
            raise _fail(prim, f"input port {port!r} is bound to {what}")
        if have is not want and not compatible(have, want):
            raise _fail(prim, f"input port {port!r} expects {want} but {ref} is {have}")
    for port in spec.inputs:
        if port not in prim.inputs and port not in spec.optional_inputs:
            raise _fail(prim, f"required input port {port!r} is unbound")


def _check_attrs(prim: Primitive) -> None:
    unknown = prim.spec.unknown_attrs(prim.attrs)
    if unknown:
        raise _fail(prim, f"unknown attribute(s) {unknown} for {prim.op} "
                          f"(its own: {', '.join(prim.spec.attrs) or 'none'}; any op: {', '.join(COMMON_ATTRS)})")
    if prim.op is Op.FORMAT:
        missing = [v for v in template_vars(prim.attrs.get("parts", ())) if v not in prim.inputs]
        if missing:
            raise _fail(prim, f"template uses {missing} but no input port has that name")
    if prim.op is Op.AGGREGATE and prim.attrs.get("mode", "concat") not in AGGREGATE_MODES:
        raise _fail(prim, f"unknown aggregate mode {prim.attrs.get('mode')!r} "
                          f"(known: {', '.join(AGGREGATE_MODES)})")
