"""Chains of splittable primitives: what stage decomposition and decode pipelining rewrite.

A chain is a path head -> ... -> tail in which every later link reads *all* its split
inputs from split outputs of earlier links (at least one from the previous link) and
nothing else from the chain. By the splitting law (see ir/ops.py) the whole chain is
then an elementwise map of the head's split inputs, so it can run shard by shard, or
item by item as a decode streams them.
"""

from __future__ import annotations

from typing import Callable, Collection

from ..ir.graph import PGraph
from ..ir.node import Primitive, Ref


def untouched(prim: Primitive) -> bool:
    """Not already sharded or streamed by an earlier pass run."""
    return not prim.shard and not prim.attrs.get("stream_from")


def joinable(claimed: Collection[str]) -> Callable[[Primitive], bool]:
    """May a node become a chain link: splittable, untouched, not in another chain yet."""
    return lambda prim: prim.spec.splittable and untouched(prim) and prim.name not in claimed


def _extends(graph: PGraph, cand: Primitive, tail: str, members: Collection[str]) -> bool:
    spec = cand.spec
    if cand.name in members or not spec.splittable:
        return False
    if any(port not in cand.inputs for port in spec.split_inputs):
        return False
    from_tail = False
    for port, ref in cand.inputs.items():
        inside = ref.node in members
        if port in spec.split_inputs:
            if not inside or ref.port not in graph[ref.node].spec.split_outputs:
                return False
            from_tail |= ref.node == tail
        elif inside:  # a broadcast input would need the whole, un-split value
            return False
    # Waiting on a link is fine only where data already orders the two (then per shard).
    data_from = {ref.node for ref in cand.inputs.values()}
    return from_tail and all(a in data_from for a in cand.after if a in members)


def grow_chain(graph: PGraph, head: Primitive, may_join: Callable[[Primitive], bool]) -> list[Primitive]:
    """The longest chain from ``head`` (first eligible consumer wins at each step)."""
    chain, members = [head], {head.name}
    while True:
        tail = chain[-1].name
        nxt = next((graph[c] for c in graph.consumers(tail)
                    if _extends(graph, graph[c], tail, members) and may_join(graph[c])), None)
        if nxt is None:
            return chain
        chain.append(nxt)
        members.add(nxt.name)


def leaving_ports(graph: PGraph, prim: Primitive, members: Collection[str]) -> list[str]:
    """Output ports of a chain link read outside the chain (by a node or a graph output)."""
    ports = []
    for port in prim.outputs:
        ref = Ref(prim.name, port)
        if graph.is_output(ref) or any(c not in members for c, _ in graph.uses(ref)):
            ports.append(port)
    return ports
