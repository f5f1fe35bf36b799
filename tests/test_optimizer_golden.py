"""Each pass on the paper's apps, checked structurally: which nodes exist, with which op
and attrs, wired how. Plus the pass manager's contract."""

from __future__ import annotations

import networkx as nx
import pytest

from teola_plugin.errors import ConfigError, GraphValidationError
from teola_plugin.ir import Op, PGraph, PortType, Ref
from teola_plugin.capture.app_graphs import (QA_TEMPLATE, add_ingestion, add_retrieval, advanced_rag,
                                             naive_rag, search_augmented)
from teola_plugin.capture.module_order import ModuleOrder
from teola_plugin.ir.testing import ToyEngines
from teola_plugin.optimizer import CostModel, PassManager, available_passes, optimize
from teola_plugin.optimizer.passes import DEFAULT_ORDER, Pass

DOCS = [f"document {i} " + " ".join(f"w{(i * 7 + j) % 13}" for j in range(9)) for i in range(30)]
DEFAULT = CostModel.default()


def by_op(g: PGraph, op: Op) -> list[str]:
    return [p.name for p in g.nodes if p.op is op]


def same_outputs(a: PGraph, b: PGraph, **inputs) -> bool:
    return ToyEngines().run(a, **inputs) == ToyEngines().run(b, **inputs)


# -- dependency pruning -----------------------------------------------------------------
def test_prune_lets_the_query_embedding_overlap_ingestion():
    g = naive_rag()
    out = optimize(g, passes=["prune_dependencies"])
    before, after = g.to_networkx(), out.to_networkx()
    assert nx.has_path(before, "vector_insert", "embed_1")  # module order made it wait
    assert not nx.has_path(after, "vector_insert", "embed_1")
    assert out["vector_search"].inputs["index"] == Ref("vector_insert", "index")  # the real wait stays
    assert all(not p.after for p in out.nodes)  # only one side effect: no order left to keep
    assert same_outputs(g, out, question="w3?", docs=DOCS, index="idx")


def test_prune_keeps_side_effects_in_order_through_pure_nodes():
    g = PGraph()
    idx, docs = g.input("index", PortType.INDEX), g.input("docs", PortType.DOCS)
    vecs = g.input("vectors", PortType.VECTORS)
    first = g.add(Op.VECTOR_INSERT, name="first", inputs={"index": idx, "vectors": vecs, "docs": docs})
    mid = g.add(Op.AGGREGATE, name="mid", inputs={"in0": docs}, after=[first])
    second = g.add(Op.VECTOR_INSERT, name="second", inputs={"index": idx, "vectors": vecs, "docs": docs},
                   after=[mid])
    log = g.add(Op.OPAQUE, name="log", inputs={"x": second.out()}, after=[second], outputs=["out"])
    g.output("out", log.out())
    out = optimize(g, passes=["prune"])
    assert out["second"].after == {"first"}  # was: after mid, which was after first
    assert out["mid"].after == frozenset()
    assert out["log"].after == frozenset()  # already ordered by data


def test_prune_keeps_a_search_before_a_later_insert_into_the_same_index():
    g = PGraph()
    question, docs = g.input("question", PortType.TEXT), g.input("docs", PortType.DOCS)
    t = ModuleOrder(g)
    before = add_retrieval(t, question, g.input("index", PortType.INDEX), top_k=3)
    add_ingestion(t, docs, Ref("input", "index"), n_docs=10)  # chat memory: then store
    g.output("hits", before)
    out = optimize(g, passes=["prune"])
    assert out["vector_insert"].after == {"vector_search"}  # write after the earlier read
    assert out["embed"].after == frozenset()
    inputs = dict(question="w2", docs=DOCS, index="idx")
    assert ToyEngines().run(out, adversarial=True, **inputs) == {"hits": []}  # nothing was stored yet


# -- common subexpressions -----------------------------------------------------------------
def test_cse_merges_the_same_question_embedded_twice():
    g = naive_rag()
    t = ModuleOrder(g)
    t.frontier = frozenset({"llm_decode"})
    second = add_retrieval(t, Ref("input", "question"), Ref("vector_insert", "index"), top_k=2)
    g.output("more_sources", second)
    assert len(by_op(g, Op.EMBED)) == 3
    out = optimize(g, passes=["prune", "cse"])
    query_embeds = [n for n in by_op(out, Op.EMBED) if out[n].attrs.get("est_items") == 1]
    assert query_embeds == ["embed_1"]
    searches = by_op(out, Op.VECTOR_SEARCH)
    assert len(searches) == 2  # different top_k: not the same value
    assert {out[s].inputs["vectors"] for s in searches} == {Ref("embed_1", "vectors")}
    assert out.history[1].removed_nodes == ("aggregate_2", "embed_2")
    assert same_outputs(g, out, question="w5", docs=DOCS, index="idx")


def test_cse_never_merges_sampled_decodes():
    def two_decodes(temperature):
        g = PGraph()
        s = g.input("s", PortType.LLM_STATE)
        for name in ("d1", "d2"):
            g.output(name, g.add(Op.LLM_DECODE, name=name, inputs={"state": s},
                                 attrs={"temperature": temperature}).out("text"))
        return optimize(g, passes=["cse"])
    assert by_op(two_decodes(0.7), Op.LLM_DECODE) == ["d1", "d2"]
    g = PGraph()
    s = g.input("s", PortType.LLM_STATE)
    for name in ("d1", "d2"):
        g.output(name, g.add(Op.LLM_DECODE, name=name, inputs={"state": s},
                             attrs={"sampling_params": {"temperature": 1.0}}).out("text"))
    assert len(optimize(g, passes=["cse"])) == 2
    g = PGraph()  # the runtime's convention: sampling parameters on the prefill
    p = g.input("p", PortType.PROMPT)
    for name in ("d1", "d2"):
        pre = g.add(Op.LLM_PREFILL, inputs={"prompt": p}, attrs={"sampling_params": {"temperature": 0.8}})
        g.output(name, g.add(Op.LLM_DECODE, name=name, inputs={"state": pre.out()}).out("text"))
    assert by_op(optimize(g, passes=["cse"]), Op.LLM_DECODE) == ["d1", "d2"]
    assert by_op(two_decodes(0.0), Op.LLM_DECODE) == ["d1"]


def test_cse_does_not_merge_side_effects():
    g = PGraph()
    args = {"index": g.input("i", PortType.INDEX), "vectors": g.input("v", PortType.VECTORS),
            "docs": g.input("d", PortType.DOCS)}
    g.add(Op.VECTOR_INSERT, inputs=args)
    g.add(Op.VECTOR_INSERT, inputs=args)
    assert len(optimize(g, passes=["cse"])) == 2


# -- stage decomposition -----------------------------------------------------------------
def test_decompose_shards_ingestion_and_joins_the_index():
    g = naive_rag()
    out = optimize(g, passes=["prune", "decompose"])
    inserts = by_op(out, Op.VECTOR_INSERT)
    n = len(inserts)
    assert n >= 2 and {"chunk", "embed", "vector_insert"}.isdisjoint(out.topological_order())
    for i in range(n):
        chunk, embed, insert = (out[f"{s}.shard{i}"] for s in ("chunk", "embed", "vector_insert"))
        assert [p.attrs["shard"] for p in (chunk, embed, insert)] == [(i, n)] * 3
        assert chunk.attrs["sliced"] == ["docs"] and embed.attrs["sliced"] == insert.attrs["sliced"] == []
        assert embed.inputs["texts"] == Ref(chunk.name, "texts")
        assert insert.inputs["vectors"] == Ref(embed.name, "vectors")
        assert insert.inputs["docs"] == Ref(chunk.name, "chunks")
        assert insert.inputs["index"] == Ref("input", "index")
        assert insert.attrs["shard_of"] == "vector_insert"
    join = out["vector_insert.join"]
    assert join.op is Op.AGGREGATE and join.attrs["mode"] == "join"
    assert dict(join.inputs) == {f"in{i}": Ref(f"vector_insert.shard{i}", "index") for i in range(n)}
    assert out["vector_search"].inputs["index"] == join.out()
    assert same_outputs(g, out, question="w7", docs=DOCS, index="idx")


def test_decompose_shard_count_comes_from_the_cost_model():
    linear = CostModel({"embedder": {"embed": {"batch": [0, 100], "latency_s": [0.0, 1.0]}},
                        "vector_store": {"vector_insert": {"batch": [0, 100], "latency_s": [0.0, 1.0]}}})
    overhead = CostModel({"embedder": {"embed": {"batch": [1, 1000], "latency_s": [5.0, 5.1]}}})
    pm = PassManager(["prune", "decompose"], options={"max_shards": 4})
    assert len(by_op(pm.run(naive_rag(), linear), Op.EMBED)) == 4 + 1  # no overhead: as many as allowed
    assert by_op(pm.run(naive_rag(), overhead), Op.EMBED) == ["embed", "embed_1"]  # overhead: stay whole
    assert by_op(pm.run(naive_rag(n_docs=10), linear), Op.EMBED) == ["embed", "embed_1"]  # < 2 shards of 8


def test_decompose_needs_a_real_gain_not_a_rounding_one():
    """A lone embedding of a document upload (LlamaIndex's traced ingestion: its insert is
    not in the chain) on a compute-bound curve: two half calls cost what one whole call
    does, so the model's gain is rounding, and the split stays off unless asked for."""
    g = PGraph()
    texts = g.input("texts", PortType.TEXTS)
    embed = g.add(Op.EMBED, name="embed", inputs={"texts": texts}, attrs={"est_items": 100})
    g.output("vectors", embed.out("vectors"))
    near_tie = CostModel({"embedder": {"embed": {"batch": [32, 64], "latency_s": [0.0914, 0.183]}}})
    assert by_op(PassManager(["decompose"]).run(g, near_tie), Op.EMBED) == ["embed"]
    forced = PassManager(["decompose"], options={"min_gain": 0.0}).run(g, near_tie)
    assert len(by_op(forced, Op.EMBED)) > 1  # the option is what declined it


def test_decompose_concatenates_split_outputs_read_outside_the_chain():
    g = naive_rag()
    g.output("chunks", Ref("chunk", "chunks"))
    out = optimize(g, passes=["prune", "decompose"])
    concat = out[out.outputs["chunks"].node]
    assert concat.op is Op.AGGREGATE and concat.attrs == {"mode": "concat", "gathers": "chunk"}
    assert all(r.node.startswith("chunk.shard") for r in concat.inputs.values())
    assert same_outputs(g, out, question="w1", docs=DOCS, index="idx")


# -- prefill splitting -----------------------------------------------------------------
def test_split_prefill_prefills_instruction_and_question_early():
    g = naive_rag()
    out = optimize(g, passes=["prune", "split_prefill"])
    (partial,) = by_op(out, Op.LLM_PARTIAL_PREFILL)
    prefix_fmt = out[out[partial].inputs["prompt"].node]
    assert prefix_fmt.op is Op.FORMAT and prefix_fmt.attrs["prefix_of"] == "format"
    assert prefix_fmt.attrs["parts"] == QA_TEMPLATE[:3]  # up to, not including, the context
    assert dict(prefix_fmt.inputs) == {"question": Ref("input", "question")}
    assert out["llm_prefill"].inputs["prefix"] == Ref(partial, "done")  # a data edge: prune keeps it
    assert out["llm_prefill"].attrs["cached_prefix_tokens"] == out[partial].attrs["est_prompt_tokens"] > 16
    assert out[partial].engine == out["llm_prefill"].engine  # the cache lives in that engine
    engines = ToyEngines()
    engines.run(out, question="w2?", docs=DOCS, index="idx")
    assert len(engines.prefix_hits) == 1  # the full prompt really starts with the cached prefix


def test_split_prefill_only_when_retrieval_hides_it():
    fast = optimize(search_augmented(), passes=["prune", "split_prefill"])
    assert not by_op(fast, Op.LLM_PARTIAL_PREFILL)  # a 2 ms search cannot hide a prefill call
    web = CostModel({"search": {"search": {"batch": [1], "latency_s": [0.8]}}})
    slow = PassManager(["prune", "split_prefill"]).run(search_augmented(), web)
    assert len(by_op(slow, Op.LLM_PARTIAL_PREFILL)) == 1


def test_split_prefill_skips_short_prefixes_and_fully_known_prompts():
    g = PGraph()
    q, ctx = g.input("q", PortType.TEXT), g.input("ctx", PortType.HITS)
    hits = g.add(Op.RERANK, inputs={"query": q, "hits": ctx}, attrs={"est_latency_s": 5.0})
    fmt = g.add(Op.FORMAT, inputs={"q": q, "c": hits.out()},
                attrs={"parts": ["Q: ", {"var": "q"}, {"var": "c"}]})  # a 3-character known prefix
    prefill = g.add(Op.LLM_PREFILL, inputs={"prompt": fmt.out()})
    g.output("a", g.add(Op.LLM_DECODE, inputs={"state": prefill.out()}).out("text"))
    assert not by_op(optimize(g, passes=["split_prefill"]), Op.LLM_PARTIAL_PREFILL)
    # advanced RAG's expansion prompt is known entirely up front: nothing to split there
    out = optimize(advanced_rag(), passes=["prune", "split_prefill"])
    assert [out[p].attrs["prefix_of"] for p in by_op(out, Op.LLM_PARTIAL_PREFILL)] == ["llm_prefill_1"]


# -- decode pipelining -----------------------------------------------------------------
def test_pipeline_decode_streams_expanded_queries_into_retrieval():
    g = advanced_rag()
    out = optimize(g, passes=["prune", "pipeline_decode"])
    assert out["llm_decode"].attrs["stream_items"] is True
    assert out["embed_1"].attrs["stream_from"] == "llm_decode"
    assert out["vector_search"].attrs["stream_from"] == "llm_decode"
    collect = out["vector_search.collect"]
    assert collect.attrs["mode"] == "concat" and collect.inputs["in0"] == Ref("vector_search", "hits")
    assert out["aggregate"].attrs["mode"] == "rrf" and out["aggregate"].inputs["in0"] == collect.out()
    assert "stream_items" not in out["llm_decode_1"].attrs  # the answer has no items
    assert not any(out[n].attrs.get("stream_from") for n in ("rerank", "aggregate", "embed"))
    assert same_outputs(g, out, question="w4", docs=DOCS, index="idx")



def test_pipeline_decode_leaves_a_json_list_decode_whole():
    """A JSON list's items are known only when it closes, at the decode's end: nothing to overlap."""
    g = advanced_rag()
    g.set_attrs("llm_decode", parse="json_list")
    out = optimize(g, passes=["prune", "pipeline_decode"])
    assert not any(p.attrs.get("stream_items") or p.attrs.get("stream_from") for p in out.nodes)

# -- engines sharing hardware ----------------------------------------------------------
SHARED_CPU = CostModel.default().with_compute_groups({}, default_group="cpu:host")  # no GPU: one set of cores


def test_overlap_passes_decline_when_every_engine_shares_the_cpu():
    """On one CPU, overlapping the embedder with the store or with vLLM frees no time: each
    pass that only overlaps engines keeps the graph, and says nothing was worth it."""
    pm = PassManager(["prune", "decompose"], options={"max_shards": 4})
    linear = CostModel({"embedder": {"embed": {"batch": [0, 100], "latency_s": [0.0, 1.0]}},
                        "vector_store": {"vector_insert": {"batch": [0, 100], "latency_s": [0.0, 1.0]}}})
    assert len(by_op(pm.run(naive_rag(), linear), Op.EMBED)) == 5  # own hardware: sharded
    assert by_op(pm.run(naive_rag(), linear.with_compute_groups({}, default_group="cpu")), Op.EMBED) == [
        "embed", "embed_1"]
    web = CostModel({"search": {"search": {"batch": [1], "latency_s": [0.8]}}})
    assert by_op(PassManager(["prune", "split_prefill"]).run(search_augmented(), web), Op.LLM_PARTIAL_PREFILL)
    shared_web = web.with_compute_groups({"search": "cpu", "llm": "cpu"})
    assert not by_op(PassManager(["prune", "split_prefill"]).run(search_augmented(), shared_web),
                     Op.LLM_PARTIAL_PREFILL)
    out = optimize(advanced_rag(), passes=["prune", "pipeline_decode"], cost_model=SHARED_CPU)
    assert "stream_items" not in out["llm_decode"].attrs


def test_a_search_on_other_hardware_still_hides_a_prefill_on_a_shared_cpu():
    """Only work on the LLM's own hardware counts: a remote search engine still hides it."""
    web = CostModel({"search": {"search": {"batch": [1], "latency_s": [0.8]}}})
    split = web.with_compute_groups({"search": "remote", "llm": "cpu", "cpu": "cpu"})
    assert len(by_op(PassManager(["prune", "split_prefill"]).run(search_augmented(), split),
                     Op.LLM_PARTIAL_PREFILL)) == 1


def test_the_prefill_window_counts_the_llm_hardware_work_the_prefix_does_not_wait_for():
    """split_prefill charges the partial prefill with the work on the LLM's own hardware that
    the full prompt waits for and its prefix does not: the walk up from the prompt equals
    that set difference, capped at the partial's own time."""
    from teola_plugin.ir.analysis import upstream
    from teola_plugin.ir.semantics import template_vars
    from teola_plugin.optimizer.context import PassContext
    from teola_plugin.optimizer.passes.split_prefill import _early_nodes, _known_prefix, _shared_work

    g = optimize(advanced_rag(), passes=["prune"])
    ctx = PassContext(SHARED_CPU)
    fmt, prefill = g["format_1"], g["llm_prefill_1"]  # the answer: its question is early, its context late
    needs = [fmt.inputs[v].node for v in template_vars(_known_prefix(fmt, _early_nodes(g)))
             if fmt.inputs[v].node != "input"] + list(fmt.after)
    window = upstream(g, g.predecessors(prefill.name)) - upstream(g, needs) - {fmt.name}
    expected = sum(ctx.cost(g[n]) for n in window if SHARED_CPU.shares_compute(g[n], prefill))
    assert {"embed", "vector_search", "rerank", "llm_decode"} <= window and "format_1" not in window
    assert _shared_work(g, ctx, fmt, prefill, needs, limit=1e9) == pytest.approx(expected)
    assert _shared_work(g, ctx, fmt, prefill, needs, limit=expected / 2) == expected / 2
    assert _shared_work(g, PassContext(DEFAULT), fmt, prefill, needs, limit=1e9) == 0.0  # own hardware


def test_compute_groups_follow_engine_names_then_kinds_then_the_default():
    from teola_plugin.ir.node import Primitive

    cost = CostModel(compute_groups={"llm": "gpu:0", "cpu": "host"}, default_group="host")
    assert cost.compute_group("llm", "llm") == "gpu:0"
    assert cost.compute_group("my_embedder", "embedder") == "host"
    assert CostModel().compute_group("a") != CostModel().compute_group("b")  # nobody said: apart
    with pytest.raises(ConfigError, match="compute_groups"):
        CostModel(compute_groups={"llm": 0})
    g = naive_rag()
    assert cost.shares_compute(g["embed"], g["chunk"]) and not cost.shares_compute(g["embed"], g["llm_prefill"])
    assert isinstance(g["embed"], Primitive)
    gpu = CostModel(compute_groups={"llm": "gpu:llm"}, default_group="cpu:host")
    a = advanced_rag()
    assert not gpu.shares_compute(a["llm_prefill"], a["llm_prefill_1"])  # batched on the GPU
    assert SHARED_CPU.shares_compute(a["llm_prefill"], a["llm_prefill_1"])  # one CPU: they take turns


# -- dead code -------------------------------------------------------------------------
def test_dead_code_removes_unused_pure_work_only():
    g = naive_rag()
    g.add(Op.EMBED, name="unused_embed", inputs={"texts": Ref("aggregate", "out")})
    g.add(Op.OPAQUE, name="audit_log", inputs={"q": Ref("input", "question")}, outputs=["out"])
    out = optimize(g, passes=["dead"])
    assert "unused_embed" not in out and "audit_log" in out
    assert out.history[0].removed_nodes == ("unused_embed",)


# -- the pass manager ------------------------------------------------------------------
def test_unknown_pass_names_fail_at_construction_listing_valid_names():
    with pytest.raises(ConfigError, match="'split_prefil'.*valid names: prune_dependencies, eliminate_common"):
        PassManager(["split_prefil"])
    with pytest.raises(ConfigError, match="'nope' in disabled"):
        PassManager(disabled=["nope"])
    assert list(available_passes()) == list(DEFAULT_ORDER)
    assert PassManager(disabled=["split_prefill", "cse"]).names == [
        "prune_dependencies", "decompose_stages", "pipeline_decode", "eliminate_dead"]


def test_disabling_a_pass_is_an_ablation():
    out = optimize(naive_rag(), disabled=["split_prefill"])
    assert not by_op(out, Op.LLM_PARTIAL_PREFILL) and len(by_op(out, Op.VECTOR_INSERT)) > 1


def test_input_graph_is_never_mutated_and_history_is_recorded():
    g = naive_rag()
    snapshot, prims = g.summary(), {p.name: p for p in g.nodes}
    out = optimize(g)
    assert g.summary() == snapshot and all(g[n] is p for n, p in prims.items()) and g.history == []
    assert [r.pass_name for r in out.history] == list(DEFAULT_ORDER)
    prune = out.history[0]
    assert ("embed_1", "aggregate") in {(e.dst, e.src) for e in prune.removed_edges if e.kind == "control"}
    assert not out.history[1].changed  # nothing to merge in naive RAG
    text = out.explain()
    assert "embed_1 no longer waits for aggregate" in text and "llm_prefill.partial (llm_partial_prefill)" in text
    assert text.count("critical path") == len(DEFAULT_ORDER) + 1


def test_critical_path_shrinks_on_both_rag_apps():
    for g in (naive_rag(), advanced_rag()):
        before = g.critical_path(DEFAULT)[0]
        after = optimize(g).critical_path(DEFAULT)[0]
        assert after < before * 0.95, g.name


def test_a_pass_producing_an_invalid_graph_is_named():
    def broken(graph, ctx):
        g = graph.copy()
        g.add_after("llm_decode", "ghost")
        return g
    pm = PassManager(["prune"])
    pm.passes.append(Pass("broken_pass", "adds a dangling wait", broken))
    with pytest.raises(GraphValidationError, match="pass 'broken_pass' produced an invalid graph.*ghost"):
        pm.run(naive_rag())


def test_a_pass_that_edits_its_input_fails_loudly():
    def sneaky(graph, ctx):
        graph.set_attrs("llm_decode", max_tokens=1)
        return graph
    pm = PassManager([])
    pm.passes.append(Pass("sneaky", "edits in place", sneaky))
    g = naive_rag()
    with pytest.raises(RuntimeError, match="frozen") as err:
        pm.run(g)
    assert "in optimizer pass 'sneaky'" in err.value.__notes__
    assert g["llm_decode"].attrs["max_tokens"] == 128


def test_optimizing_twice_changes_nothing_more():
    once = optimize(naive_rag())
    twice = optimize(once)
    assert twice.summary() == once.summary()
    assert not any(r.changed for r in twice.history[-len(DEFAULT_ORDER):])


def test_a_broken_graph_is_blamed_on_the_pass_that_made_it_even_when_a_later_pass_trips_on_it():
    def broken(graph, ctx):
        g = graph.copy()
        g.add_after("llm_decode", "ghost")
        return g

    def trips(graph, ctx):
        raise KeyError("ghost")
    pm = PassManager(["prune"])
    pm.passes += [Pass("broken_pass", "adds a dangling wait", broken), Pass("next_pass", "reads it", trips)]
    with pytest.raises(GraphValidationError, match="pass 'broken_pass' produced an invalid graph.*ghost"):
        pm.run(naive_rag())
