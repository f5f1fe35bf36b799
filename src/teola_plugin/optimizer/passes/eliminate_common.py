"""Common-subexpression elimination: compute each pure value once.

Two pure primitives with the same op, engine, attrs, inputs and control dependencies
compute the same thing (e.g. the question embedded by two retrievers); the later one
is dropped and its readers read the first. Visiting in topological order lets merges
cascade (two identical embeds of two merged aggregates merge too).

An LLM request that samples (temperature > 0) is pure but not deterministic: merging two
draws would change what the application computes, so it is never merged.
"""

from __future__ import annotations

from typing import Hashable

from ...ir.graph import PGraph
from ...ir.node import Primitive, Ref
from ...ir.ops import Op
from ..context import PassContext

NAME = "eliminate_common"
DESCRIPTION = "merge pure primitives that compute the same value from the same inputs"


def _samples(prim: Primitive) -> bool:
    """An LLM request that samples: its sampling parameters live on the prefill (where the
    request is opened) or the decode; either way, two of them are two different draws."""
    if prim.op not in (Op.LLM_PREFILL, Op.LLM_DECODE):
        return False
    params = prim.attrs.get("sampling_params") or {}
    return float(prim.attrs.get("temperature", params.get("temperature", 0)) or 0) > 0


def _mergeable(prim: Primitive) -> bool:
    return prim.pure and not _samples(prim)


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    rep: dict[str, str] = {}  # duplicate -> the node that stays
    seen: dict[Hashable, list[Primitive]] = {}  # structural key -> kept nodes (attrs differ)
    for prim in graph.nodes:
        if not _mergeable(prim):
            continue
        key = (  # attrs are compared only on a key hit: nested, unhashable, and rarely needed
            prim.op, prim.engine, prim.outputs,
            tuple(sorted((port, rep.get(r.node, r.node), r.port) for port, r in prim.inputs.items())),
            tuple(sorted({rep.get(a, a) for a in prim.after})),
        )
        kept = seen.setdefault(key, [])
        twin = next((k for k in kept if k.attrs == prim.attrs), None)
        if twin is not None:
            rep[prim.name] = twin.name
        else:
            kept.append(prim)
    if not rep:
        return graph
    g = graph.copy()
    for dup in reversed(g.topological_order()):  # readers before what they read
        if dup not in rep:
            continue
        keep = rep[dup]
        for port in g[dup].outputs:
            g.replace_uses(Ref(dup, port), Ref(keep, port))
        for follower in g.followers(dup):
            g.set_after(follower, (g[follower].after - {dup}) | {keep})
        g.remove(dup)
    pairs = ", ".join(f"{d} into {k}" for d, k in list(rep.items())[:6])
    ctx.note(f"merged {len(rep)} duplicate primitive(s): {pairs}")
    return g
