"""The primitive IR: vocabulary (ops, ports), the PGraph, and its reference interpreter.

Depends on the standard library and networkx only; never on a framework or an engine.
"""

from ..errors import GraphValidationError
from .graph import PGraph
from .history import Edge, PassRecord
from .interpreter import Interpreter
from .node import INPUT, OUTPUT, Primitive, Ref
from .ops import OPS, Op, OpSpec, spec_of
from .ports import PortType, compatible

__all__ = [
    "Edge", "GraphValidationError", "INPUT", "Interpreter", "OPS", "OUTPUT", "Op", "OpSpec",
    "PGraph", "PassRecord", "PortType", "Primitive", "Ref", "compatible", "spec_of",
]
