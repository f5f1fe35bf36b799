"""Prefill splitting: prefill the prompt prefix that is known early, while retrieval runs.

A RAG prompt usually starts with an instruction and the question, both known when the
query arrives, and ends with retrieved context. For a format -> llm_prefill pair whose
leading template parts read only *early* values (graph inputs, or pure CPU primitives
of early values), this adds ``format(prefix) -> llm_partial_prefill`` and makes the
llm_prefill wait for it through its ``prefix`` SIGNAL port (a data edge, so dependency
pruning and dead-code elimination keep it). On stock vLLM the partial prefill is a
max_tokens=1 request that fills the automatic prefix cache, so the full request only
prefills the rest. A step whose LLM calls are built at run time (LlamaIndex's synthesis)
states their template as ``warm_prompt``; its warm-up is planned the same way and the step
waits for it. A template only the framework renders (``render``) is warmed by that render,
cut before the late variables.

Skipped when the prefix is too short to fill a KV-cache block (``min_prefix_chars``,
default 64 characters ~ 16 tokens, counting ``var_chars``, default 16, per variable; for a
model server, its detected block size), when a model server is not known to cache prefixes
(detected from its metrics: ``engines/server_features.py``; the note says why),
or when the cost model says the prefill would not finish earlier (the second request
costs a fixed overhead; it pays only if retrieval is long enough to hide the prefix).
Retrieval hides the prefix only on other hardware: work in the window on the LLM's own
compute group (e.g. the embedder on the same CPU cores as vLLM) is delayed by the
partial prefill instead, so a CPU-only machine rarely gains from this pass.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ...ir.analysis import upstream
from ...ir.graph import PGraph
from ...ir.node import INPUT, FrozenDict, Primitive
from ...ir.semantics import CHARS_PER_TOKEN
from ...ir.ops import Op
from ...ir.semantics import template_vars
from ..context import PassContext

NAME = "split_prefill"
DESCRIPTION = "prefill the early-known prompt prefix in parallel with retrieval"


def _early_nodes(graph: PGraph) -> set[str]:
    early: set[str] = set()
    for p in graph.nodes:
        if (p.pure and p.kind == "cpu"
                and all(r.node == INPUT or r.node in early for r in p.inputs.values())
                and all(a in early for a in p.after)):
            early.add(p.name)
    return early


def _known_prefix(fmt: Primitive, early: set[str]) -> list[Any]:
    parts = fmt.attrs["parts"]
    for k, part in enumerate(parts):
        if isinstance(part, Mapping):
            ref = fmt.inputs[part["var"]]
            if ref.node != INPUT and ref.node not in early:
                return parts[:k]
    return list(parts)


def _pays_off(graph: PGraph, ctx: PassContext, fmt: Primitive, prefill: Primitive,
              prefix: list[Any], tokens: int) -> bool:
    """Would the prefill finish earlier with the prefix prefilled ahead? Engines on other
    hardware run side by side; work on the LLM's own hardware takes turns with it."""
    cost, finish = ctx.cost_model, ctx.finish_times(graph)

    def ready(names: Any) -> float:
        return max((finish[n] for n in names), default=0.0)

    fmt_done = ready(graph.predecessors(fmt.name)) + cost.node_cost(fmt)
    others = ready(q for q in graph.predecessors(prefill.name) if q != fmt.name)
    prefix_inputs = [fmt.inputs[v].node for v in template_vars(prefix) if fmt.inputs[v].node != INPUT]
    partial = cost.latency(prefill.engine, Op.LLM_PARTIAL_PREFILL, tokens, prefill.kind)
    prefix_done = ready([*prefix_inputs, *fmt.after]) + cost.node_cost(fmt) + partial
    delay = _shared_work(graph, ctx, fmt, prefill, [*prefix_inputs, *fmt.after], limit=partial)
    old_end = max(fmt_done, others) + cost.node_cost(prefill)
    rest = max(1.0, cost.work_items(prefill) - tokens)
    return max(fmt_done + delay, others + delay, prefix_done) + cost.node_cost(prefill, items=rest) < old_end


def _shared_work(graph: PGraph, ctx: PassContext, fmt: Primitive, prefill: Primitive,
                 prefix_needs: list[str], limit: float) -> float:
    """Work on the LLM's own hardware in the window the partial prefill runs in (what the
    full prompt waits for and the prefix does not), counted up to ``limit``: that work
    finishes later by up to the partial's time. The window is walked upwards from the
    prompt's predecessors, stopping at what the prefix needs (whose ancestors it needs too),
    and not at all where nothing shares the LLM's hardware."""
    cost = ctx.cost_model
    if not cost.may_share_compute(prefill):
        return 0.0
    seen = upstream(graph, prefix_needs)
    stack, shared = list(graph.predecessors(prefill.name)), 0.0
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        prim = graph[name]
        if name != fmt.name and cost.shares_compute(prim, prefill):
            shared += ctx.cost(prim)
            if shared >= limit:
                return limit
        stack.extend(graph.predecessors(name))
    return shared


def _prefix_render(fmt: Primitive, prefix: list[Any]) -> dict[str, Any]:
    """The attributes that render ``fmt``'s prefix with its own ``render``: every variable
    the prefix does not read is the cut mark, and the prompt ends before the first mark."""
    if "render" not in fmt.attrs:
        return {}
    known = set(template_vars(prefix))
    return {"render": fmt.attrs["render"], "cut_vars": sorted(v for v in fmt.inputs if v not in known)}


# -- the template of the calls a step expands into (``warm_prompt`` on an opaque step) --------


def _prompts(graph: PGraph) -> Iterator[tuple[Primitive, Primitive, Primitive]]:
    """(waiter, format, prefill) of each prompt an LLM call will prefill: a format read by an
    llm_prefill, or the template of the calls a step expands into at run time
    (``warm_prompt``: LlamaIndex's synthesis), stood in for by a format over the step's
    inputs and a prefill of its engine, both under the step's name (the pass reads their
    costs and the step's place in the graph; neither is added)."""
    for p in graph.nodes:
        if "prefix" in p.inputs:
            continue
        ref = p.inputs.get("prompt")
        if p.op is Op.LLM_PREFILL and ref is not None and ref.node in graph:
            fmt = graph[ref.node]
            if fmt.op is Op.FORMAT and "parts" in fmt.attrs:
                yield p, fmt, p
        elif p.op is Op.OPAQUE and "warm_prompt" in p.attrs:
            warm = p.attrs["warm_prompt"]
            attrs = {"parts": list(warm["parts"]), **({"render": warm["render"]} if "render" in warm else {})}
            fmt = Primitive(p.name, Op.FORMAT, "cpu", FrozenDict({v: p.inputs[v] for v in template_vars(attrs["parts"])}),
                            FrozenDict(attrs), frozenset(), p.origin, ("prompt",))
            prefill = Primitive(p.name, Op.LLM_PREFILL, warm["engine"], FrozenDict(),
                                FrozenDict({"est_prompt_tokens": warm["est_prompt_tokens"]}), frozenset(), p.origin,
                                ("state",))
            yield p, fmt, prefill


def run(graph: PGraph, ctx: PassContext) -> PGraph:
    min_chars = int(ctx.option("min_prefix_chars", 64))
    var_chars = int(ctx.option("var_chars", 16))
    early = _early_nodes(graph)
    plans: list[tuple[Primitive, Primitive, Primitive, list[Any], int]] = []
    for waiter, fmt, p in _prompts(graph):
        prefix = _known_prefix(fmt, early)
        if not prefix or len(prefix) == len(fmt.attrs["parts"]):
            continue  # nothing known early, or the whole prompt is: nothing to split
        chars = sum(len(x) for x in prefix if isinstance(x, str)) + var_chars * len(template_vars(prefix))
        if chars < min_chars:
            continue
        tokens = int(min(chars // CHARS_PER_TOKEN, ctx.cost_model.work_items(p) - 1))
        cache = ctx.cost_model.prefix_cache(p.engine)
        if cache is not None and not (cache.enabled and tokens >= cache.block_tokens):
            ctx.note(f"{p.name}: not split: " + (f"its ~{tokens}-token prefix is under one {cache.block_tokens}-token "
                                                 f"cache block of {p.engine}" if cache.enabled else
                                                 f"{p.engine} is not known to cache prefixes ({cache.how})"))
            continue
        if _pays_off(graph, ctx, fmt, p, prefix, tokens):
            plans.append((waiter, fmt, p, prefix, tokens))
    if not plans:
        return graph
    g = graph.copy()
    for waiter, fmt, prefill, prefix, tokens in plans:
        prefill_name, fmt_name = waiter.name, fmt.name
        fp = g.add(Op.FORMAT, name=g.unique_name(f"{fmt_name}.prefix"), engine=fmt.engine,
                   origin=fmt.origin, after=fmt.after,
                   inputs={v: fmt.inputs[v] for v in template_vars(prefix)},
                   # a chat prompt's prefix must go through the same chat template, or its
                   # tokens would not be a prefix of the full prompt's tokens; a framework's own
                   # render renders it, the later variables cut off (semantics.prompt_before_cut)
                   attrs={"parts": list(prefix), "prefix_of": fmt_name, **_prefix_render(fmt, prefix),
                          **({"chat_role": fmt.attrs["chat_role"]} if "chat_role" in fmt.attrs else {})})
        pp = g.add(Op.LLM_PARTIAL_PREFILL, name=g.unique_name(f"{prefill_name}.partial"),
                   engine=prefill.engine, origin=prefill.origin, inputs={"prompt": fp.out()},
                   attrs={"est_prompt_tokens": tokens, "prefix_of": prefill_name})
        g.set_input(prefill_name, "prefix", pp.out("done"))
        if waiter.op is Op.LLM_PREFILL:  # an expanding step's calls are costed when they exist
            g.set_attrs(prefill_name, cached_prefix_tokens=tokens)
        ctx.note(f"{prefill_name}: ~{tokens} prompt tokens prefilled early by {pp.name}")
    return g
