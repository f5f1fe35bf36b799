"""Stage decomposition: run a chain like chunk -> embed -> vector_insert in n shards.

Shard i of every link handles the i-th of n consecutive slices of the head's input, so
the embedder works on shard 2 while the vector store inserts shard 1. Where results
leave the chain, an aggregate puts them back together: ``concat`` for split outputs
(lists), ``join`` for handles (the INDEX every shard wrote into: wait for all, pass one
on). Control dependents of a link wait for all its shards.

n comes from the cost model, not a constant: the estimated pipeline makespan of n
shards, ``sum of one shard's stage costs + (n - 1) * busiest engine's per-shard cost``,
plus the gathering aggregate, must beat the unsplit chain. "Engine" there means compute
group (:meth:`CostModel.compute_group`): stages whose engines share the hardware (the
embedder and the store on one CPU) take turns on it, so their shard costs add up; shards hold at least
``min_shard_items`` (option, default 8) and n <= ``max_shards`` (default 16). Shards
pay each engine call's fixed overhead again, so a small input stays whole (n = 1).

A split must beat the unsplit chain by ``min_gain`` (option, default 5%) of its cost, not
by any margin: on a compute-bound profile n shards cost n times a 1/n-sized call, so the
model's "gain" is rounding, while each extra call really pays an RPC, a scheduling turn
and a gather the curve does not separate (measured on a 2-core CPU: two 50-text shards
of a 100-passage upload made document-QA queries 0.4-1.0 s slower than one call).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable

from ...ir.graph import PGraph
from ...ir.node import Primitive, Ref
from ...ir.ops import Op
from ..chains import grow_chain, joinable, leaving_ports
from ..context import PassContext

NAME = "decompose_stages"
DESCRIPTION = "split chains of splittable primitives into pipelined shards sized by the cost model"


def _signature(graph: PGraph, chain: list[Primitive]) -> Hashable | None:
    """All that choose_shards reads of a chain (None if attrs are unhashable): a batch of
    queries of one app repeats the same chain many times, and the choice once."""
    members = {m.name for m in chain}
    try:
        return tuple((m.op, m.engine, frozenset(m.attrs.items()), bool(leaving_ports(graph, m, members)))
                     for m in chain)
    except TypeError:
        return None


def choose_shards(graph: PGraph, chain: list[Primitive], ctx: PassContext) -> int:
    cost = ctx.cost_model
    head_items = float(chain[0].attrs["est_items"])
    max_n = min(int(ctx.option("max_shards", 16)), int(head_items // ctx.option("min_shard_items", 8)))
    if max_n < 2:
        return 1
    work = [float(m.attrs.get("est_items", head_items)) for m in chain]

    def stage_costs(n: int) -> list[float]:
        return [cost.node_cost(m, items=math.ceil(w / n)) for m, w in zip(chain, work)]

    whole = stage_costs(1)
    gather = cost.latency("cpu", Op.AGGREGATE, 1, "cpu")
    members = {m.name for m in chain}
    leaving = [k for k, m in enumerate(chain) if leaving_ports(graph, m, members)]
    best_n, best = 1, sum(whole) * (1.0 - float(ctx.option("min_gain", 0.05)))
    for n in range(2, max_n + 1):
        part = stage_costs(n)
        per_group: dict[str, float] = defaultdict(float)  # stages sharing hardware take turns
        for m, c in zip(chain, part):
            per_group[cost.compute_group(m.engine, m.kind)] += c
        makespan = sum(part) + (n - 1) * max(per_group.values()) + gather
        # Whatever reads a link's gathered result must not get it later than before.
        no_later = all(sum(part[: k + 1]) + gather <= sum(whole[: k + 1]) for k in leaving)
        if no_later and makespan < best:
            best_n, best = n, makespan
    return best_n


def shard_chain(g: PGraph, names: list[str], n: int) -> list[str]:
    """Replace the chain ``names`` in ``g`` by n shard chains; returns the gathering nodes."""
    chain = [g[name] for name in names]
    members = set(names)
    shard: dict[tuple[str, int], str] = {}
    for m in chain:
        sliced = [p for p in m.spec.split_inputs if m.inputs[p].node not in members]
        for i in range(n):
            shard[m.name, i] = g.unique_name(f"{m.name}.shard{i}")
            g.add(m.op, name=shard[m.name, i], engine=m.engine, origin=m.origin,
                  inputs={port: Ref(shard[ref.node, i], ref.port) if ref.node in members else ref
                          for port, ref in m.inputs.items()},
                  after=[shard[a, i] if a in members else a for a in m.after],
                  attrs={**m.attrs, "shard": (i, n), "shard_of": m.name, "sliced": sliced})
    gathers = []
    for m in chain:
        for port in leaving_ports(g, m, members):
            mode = "concat" if port in m.spec.split_outputs else "join"
            agg = g.add(Op.AGGREGATE, name=g.unique_name(f"{m.name}.{mode}"), origin=m.origin,
                        inputs={f"in{i}": Ref(shard[m.name, i], port) for i in range(n)},
                        attrs={"mode": mode, "gathers": m.name})
            g.replace_uses(Ref(m.name, port), agg.out(), exclude=members)
            gathers.append(agg.name)
        for follower in g.followers(m.name):
            if follower not in members:
                g.set_after(follower, (g[follower].after - {m.name}) | {shard[m.name, i] for i in range(n)})
    for m in reversed(chain):  # later links read earlier ones
        g.remove(m.name)
    return gathers


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    claimed: set[str] = set()
    plans: list[tuple[list[str], int]] = []
    decided: dict[Hashable, int] = {}
    for prim in graph.nodes:
        if not joinable(claimed)(prim) or "est_items" not in prim.attrs:
            continue
        chain = grow_chain(graph, prim, joinable(claimed))
        claimed.update(m.name for m in chain)
        key = _signature(graph, chain)
        n = decided.get(key) if key is not None else None
        if n is None:
            n = choose_shards(graph, chain, ctx)
            if key is not None:
                decided[key] = n
        if n > 1:
            plans.append(([m.name for m in chain], n))
    if not plans:
        return graph
    g = graph.copy()
    for names, n in plans:
        shard_chain(g, names, n)
        ctx.note(f"{' -> '.join(names)} runs as {n} pipelined shards")
    return g
