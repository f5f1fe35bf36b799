"""Reference interpreter: the meaning of a PGraph, one primitive at a time.

Like ``torch.fx.Interpreter``, one overridable method per op::

    run(**inputs)                 validate, bind inputs, run nodes in topological order
      └─ run_node(prim)           fetch inputs, slice shards, dispatch, free dead values
           └─ <op>(prim, inputs)  getattr(self, prim.op): chunk, embed, vector_insert, ...
                └─ call_handler   handlers[op](prim, inputs) -> {output port: value}

Handlers implement the engines' work on whole inputs and stay oblivious of optimizer
rewrites, because the interpreter applies the IR's generic semantics around them:

* a shard (``attrs["shard"] = (i, n)``) gets the i-th of n consecutive slices of its
  split inputs (``attrs["sliced"]`` narrows which ports; the head of a shard chain slices,
  later links read the already-sharded output of the previous link);
* ``aggregate`` and ``format`` (with ``attrs["parts"]``) are computed here (ir.semantics);
* a decode with ``attrs["parse"]`` gets its ``items`` parsed from ``text`` if the handler
  returned none; ``stream_from`` / ``stream_items`` are ignored: streaming changes when
  things run, never what they compute.

Each value is freed right after its last reader ran (computed once, up front); graph
outputs are kept. An exception from a handler propagates with its own type and a note
naming the primitive and the framework component it was traced from.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from . import semantics
from .graph import PGraph
from .node import INPUT, Primitive, Ref
from .ops import Op

Handler = Callable[[Primitive, dict[str, Any]], Mapping[str, Any]]


class Interpreter:
    def __init__(self, graph: PGraph, handlers: Mapping[Op, Handler] | Mapping[str, Handler] | None = None,
                 order: Sequence[str] | None = None) -> None:
        """``order``: run the nodes in this topological order instead of the graph's own
        (tests use an adversarial one to show results do not depend on tie-breaking)."""
        graph.validate()
        self.graph = graph
        self.handlers = {Op(k): v for k, v in (handlers or {}).items()}
        self.env: dict[Ref, Any] = {}  # live values only
        self._order = graph.nodes if order is None else _checked_order(graph, order)
        kept = set(graph.outputs.values())
        last_reader: dict[Ref, str] = {}
        for prim in self._order:
            for ref in prim.inputs.values():
                last_reader[ref] = prim.name
        self._free_after: dict[str, list[Ref]] = {}
        for ref, reader in last_reader.items():
            if ref not in kept:
                self._free_after.setdefault(reader, []).append(ref)
        self._read = set(last_reader) | kept  # outputs nobody reads are never stored

    # -- driver --------------------------------------------------------------------------
    def run(self, **inputs: Any) -> dict[str, Any]:
        unknown = sorted(set(inputs) - set(self.graph.inputs))
        if unknown:
            raise TypeError(f"graph {self.graph.name!r} got unexpected inputs {unknown}")
        missing = sorted(r.port for r in self._read if r.node == INPUT and r.port not in inputs)
        if missing:
            raise TypeError(f"graph {self.graph.name!r} is missing inputs {missing}")
        self.env = {Ref(INPUT, k): v for k, v in inputs.items() if Ref(INPUT, k) in self._read}
        for prim in self._order:
            try:
                self.run_node(prim)
            except Exception as exc:
                exc.add_note(f"While executing primitive {prim.name} ({prim.op}, traced from "
                             f"{prim.origin or 'an unknown component'})")
                raise
        return {name: self.env[ref] for name, ref in self.graph.outputs.items()}

    def run_node(self, prim: Primitive) -> None:
        inputs = self.fetch_inputs(prim)
        result = getattr(self, prim.op.value)(prim, inputs)
        if not isinstance(result, Mapping):
            raise TypeError(f"{prim.op} of {prim.name} returned {type(result).__name__}, "
                            "expected a dict of output port -> value")
        result = dict(result)
        if prim.op is Op.LLM_DECODE:
            if "parse" in prim.attrs and "items" not in result:
                result["items"] = semantics.parse_items(result["text"], prim.attrs["parse"])
            result.setdefault("response", None)  # no model server's reply to pass on
        for port in prim.outputs:
            ref = Ref(prim.name, port)
            if ref in self._read:
                if port not in result:
                    raise KeyError(f"{prim.op} of {prim.name} returned no {port!r} output")
                self.env[ref] = result[port]
        for ref in self._free_after.get(prim.name, ()):
            del self.env[ref]

    def fetch_inputs(self, prim: Primitive) -> dict[str, Any]:
        inputs = {port: self.env[ref] for port, ref in prim.inputs.items()}
        if prim.shard:
            i, n = prim.shard
            for port in prim.attrs.get("sliced", prim.spec.split_inputs):
                if port in inputs:
                    inputs[port] = semantics.shard_slice(inputs[port], i, n)
        return inputs

    def call_handler(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        handler = self.handlers.get(prim.op)
        if handler is None:
            raise NotImplementedError(f"no handler for op '{prim.op}'; pass handlers={{'{prim.op}': fn}} "
                                      f"or override {type(self).__name__}.{prim.op}")
        return handler(prim, inputs)

    # -- one method per op ---------------------------------------------------------------
    def chunk(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def embed(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def vector_insert(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def vector_search(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def rerank(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def search(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def llm_partial_prefill(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def llm_prefill(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def llm_decode(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return self.call_handler(prim, inputs)

    def opaque(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        fn = prim.attrs.get("fn")
        if prim.op not in self.handlers and callable(fn):  # the component itself, as lowered
            return semantics.opaque_outputs(prim.outputs, fn(**inputs))
        return self.call_handler(prim, inputs)

    def aggregate(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return {"out": semantics.aggregate(prim.attrs, inputs)}

    def format(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        if "parts" in prim.attrs:
            return {"prompt": semantics.render_format(prim.attrs, inputs)}
        return self.call_handler(prim, inputs)


def _checked_order(graph: PGraph, order: Sequence[str]) -> list[Primitive]:
    position = {name: i for i, name in enumerate(order)}
    if set(position) != set(graph.topological_order()) or len(position) != len(order):
        raise ValueError("order must list every primitive of the graph exactly once")
    for name in order:
        if any(position[p] > position[name] for p in graph.predecessors(name)):
            raise ValueError(f"order runs {name!r} before one of its predecessors")
    return [graph[name] for name in order]
