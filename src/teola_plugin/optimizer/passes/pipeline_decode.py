"""Decode pipelining: retrieve for each generated item as soon as it is complete.

Query expansion asks an LLM for several queries, one per line; the framework waits for
the whole answer, then embeds and searches them all. When a decode's ``items``
(``attrs["parse"] == "lines"``) feed a chain of splittable primitives (embed
-> vector_search), the chain is elementwise in the items, so it may process them as
they stream out. This marks the decode ``stream_items=True`` and each chain link
``stream_from=<decode>``, and inserts a ``concat`` aggregate that collects the streamed
results where they leave the chain (e.g. before the rank fusion that needs all lists).

Values are unchanged (the interpreter ignores streaming); only timing is: the cost
model charges a streamed link only for the last item, the rest hides behind the
decode. Applied only when that saving exceeds the collecting aggregate's cost. A link on
the decoding LLM's own hardware (:meth:`CostModel.shares_compute`: the embedder on the
CPU cores vLLM decodes on) saves nothing: its work only moves into the decode's time.
"""

from __future__ import annotations

from ...ir.graph import PGraph
from ...ir.node import Ref
from ...ir.ops import Op
from ..chains import grow_chain, joinable, leaving_ports
from ..context import PassContext

NAME = "pipeline_decode"
DESCRIPTION = "stream decoded items into the retrieval chain that consumes them"
# Parse modes whose items complete one by one while decoding. A JSON list's items are only
# known when the list closes, at the end of the decode: nothing would overlap.
PARSES = ("lines",)


def _plans(graph: PGraph, ctx: PassContext) -> list[tuple[str, list[str]]]:
    cost = ctx.cost_model
    gather = cost.latency("cpu", Op.AGGREGATE, 1, "cpu")
    claimed: set[str] = set()
    plans = []
    for decode in graph.nodes:
        if decode.op is not Op.LLM_DECODE or decode.attrs.get("parse") not in PARSES:
            continue
        items = Ref(decode.name, "items")
        for name, port in graph.uses(items):
            head = graph[name]
            if (not joinable(claimed)(head) or port not in head.spec.split_inputs
                    or any(head.inputs.get(p) != items for p in head.spec.split_inputs)):
                continue
            chain = grow_chain(graph, head, joinable(frozenset(claimed)))
            members = {m.name for m in chain}
            saved, ok = 0.0, True
            for m in chain:
                if not cost.shares_compute(m, decode):
                    saved += cost.node_cost(m) - cost.node_cost(m, items=1)
                if leaving_ports(graph, m, members) and saved <= gather:
                    ok = False
            if ok:
                claimed |= members
                plans.append((decode.name, [m.name for m in chain]))
    return plans


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    plans = _plans(graph, ctx)
    if not plans:
        return graph
    g = graph.copy()
    for decode, names in plans:
        g.set_attrs(decode, stream_items=True)
        members = set(names)
        for name in names:
            g.set_attrs(name, stream_from=decode)
        for name in names:
            for port in leaving_ports(g, g[name], members):
                agg = g.add(Op.AGGREGATE, name=g.unique_name(f"{name}.collect"),
                            origin=g[name].origin, inputs={"in0": Ref(name, port)},
                            attrs={"mode": "concat"})
                g.replace_uses(Ref(name, port), agg.out(), exclude=members)
        ctx.note(f"{' -> '.join(names)} consume {decode}'s items as they stream out")
    return g
