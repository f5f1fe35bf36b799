"""Properties over random applications: every subset (and order) of passes computes
exactly what the original graph computes, never lengthens the critical path, and never
touches its input.

The graphs are built from the same module lowerings the tracer uses (ingestion,
retrieval, query expansion, web search, rerank, answer), in random combinations and
sizes, sometimes without module-order waits, with duplicates, dead work, opaque side
effects, and reads of an index that is written afterwards (order that only a kept
control dependency preserves). The engines are ToyEngines: deterministic, and
elementwise where an op claims to be. Applications that are themselves racy (their
result depends on tie-breaking between unordered nodes) are discarded.
"""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from teola_plugin.ir import Op, PGraph, PortType, Ref
from teola_plugin.capture.app_graphs import (add_expanded_retrieval, add_ingestion, add_llm_call,
                                             add_rerank, add_retrieval, add_synthesis, add_web_search)
from teola_plugin.capture.module_order import ModuleOrder
from teola_plugin.ir.testing import ToyEngines
from teola_plugin.optimizer import CostModel, PassManager
from teola_plugin.optimizer.passes import DEFAULT_ORDER

DOCS = [f"doc {i} " + " ".join(f"w{(i * 5 + j) % 17}" for j in range(7 + i % 5)) for i in range(40)]
INPUTS = dict(question="which w3 matters?", docs=DOCS, index="idx")
COST = CostModel.default()
# Slow web search and reranker: retrieval long enough for prefill splitting to pay.
SLOW_RETRIEVAL = CostModel({"search": {"search": {"batch": [1], "latency_s": [0.8]}},
                            "reranker": {"rerank": {"batch": [1, 10], "latency_s": [0.2, 1.0]}}})
SUBSETS = [[p for p, keep in zip(DEFAULT_ORDER, mask) if keep]
           for mask in itertools.product([False, True], repeat=len(DEFAULT_ORDER))]
MODULES = ["ingest", "retrieve", "expand", "web", "rerank", "answer", "dead", "opaque", "short_prompt",
           "memory", "callbacks"]


@st.composite
def applications(draw) -> PGraph:
    g = PGraph("random_app")
    question = g.input("question", PortType.TEXT)
    docs = g.input("docs", PortType.DOCS)
    index = g.input("index", PortType.INDEX)
    t = ModuleOrder(g)
    hits: list[Ref] = []
    outputs = 0
    for k, module in enumerate(draw(st.lists(st.sampled_from(MODULES), min_size=1, max_size=7))):
        if draw(st.integers(0, 3)) == 0:
            t.frontier = frozenset()  # a module the framework did not order after the previous one
        if module == "ingest":
            index = add_ingestion(t, docs, index, n_docs=draw(st.sampled_from([1, 12, 40, 300])))
        elif module == "callbacks":  # two side effects whose order only a kept wait preserves
            for phase in ("start", "end"):
                t.add(Op.OPAQUE, inputs={"q": question}, attrs={"tag": f"{phase}{k}"}, outputs=["out"],
                      origin="CallbackManager")
        elif module == "memory":  # chat memory: retrieve, then store into the same index
            hits.append(add_retrieval(t, question, index, top_k=draw(st.integers(1, 4))))
            index = add_ingestion(t, docs, index, n_docs=draw(st.sampled_from([1, 40])))
        elif module == "retrieve":
            hits.append(add_retrieval(t, question, index, top_k=draw(st.integers(1, 4))))
        elif module == "expand":
            hits.append(add_expanded_retrieval(t, question, index, num_queries=draw(st.integers(1, 4)),
                                               top_k=draw(st.integers(1, 3))))
        elif module == "web":
            hits.append(add_web_search(t, question, top_k=draw(st.integers(1, 4))))
        elif module == "rerank" and hits:
            hits.append(add_rerank(t, question, draw(st.sampled_from(hits)), n_hits=10, top_n=2))
        elif module == "answer" and hits:
            g.output(f"answer{k}", add_synthesis(t, question, draw(st.sampled_from(hits)), n_hits=3))
            outputs += 1
        elif module == "dead":
            batch = t.add(Op.AGGREGATE, inputs={"in0": question}, attrs={"mode": "list"})
            t.add(Op.EMBED, inputs={"texts": batch.out()}, attrs={"est_items": 1})
        elif module == "opaque":
            src = draw(st.sampled_from([question, *hits]))
            op = t.add(Op.OPAQUE, inputs={"x": src}, attrs={"tag": k}, outputs=["out"], origin="Callback")
            if draw(st.booleans()):
                g.output(f"opaque{k}", op.out())
                outputs += 1
        elif module == "short_prompt":
            decode = add_llm_call(t, ["Q: ", {"var": "q"}], {"q": question}, "LLM", 8, 16)
            g.output(f"short{k}", decode.out("text"))
            outputs += 1
    for i, h in enumerate(hits):
        if draw(st.booleans()) or not outputs:
            g.output(f"hits{i}", h)
            outputs += 1
    if not outputs:
        g.output("index_out", index)
    g.validate()
    return g


def run(graph: PGraph, adversarial: bool = False) -> dict:
    engines = ToyEngines()
    out = engines.run(graph, adversarial=adversarial, **INPUTS)
    return {"outputs": out, "store": {k: sorted(v) for k, v in engines.store.items()}, "log": engines.log}


@settings(derandomize=True, max_examples=30, deadline=None)
@given(applications(), st.sampled_from([COST, SLOW_RETRIEVAL]))
def test_every_subset_of_passes_preserves_results_and_never_slows_down(graph, cost):
    reference = run(graph)
    assume(run(graph, adversarial=True) == reference)  # the app itself must not be racy
    snapshot = graph.summary()
    before = graph.critical_path(cost)[0]
    for subset in SUBSETS:
        optimized = PassManager(subset).run(graph, cost)
        assert run(optimized) == reference, (subset, optimized.explain())
        assert optimized.critical_path(cost)[0] <= before + 1e-9, (subset, optimized.explain())
    assert graph.summary() == snapshot
    # Results must follow from the edges alone, not from the interpreter's tie-breaking.
    assert run(PassManager().run(graph, cost), adversarial=True) == reference


@settings(derandomize=True, max_examples=15, deadline=None)
@given(applications(), st.permutations(list(DEFAULT_ORDER)), st.integers(1, 2),
       st.sampled_from([COST, SLOW_RETRIEVAL]))
def test_any_order_and_repetition_of_passes_preserves_results(graph, order, repeat, cost):
    reference = run(graph)
    assume(run(graph, adversarial=True) == reference)
    optimized = PassManager(order * repeat).run(graph, cost)
    assert run(optimized, adversarial=True) == reference, optimized.explain()
    assert optimized.critical_path(cost)[0] <= graph.critical_path(cost)[0] + 1e-9
