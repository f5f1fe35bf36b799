"""`teola demo`: document QA on the real engines, module order vs Teola's optimized graph.

Each question brings its own upload (its HotpotQA context plus distractors), which is
chunked, embedded and inserted, then retrieved and answered by vLLM. The same traced graph
runs twice on the same Ray-hosted engines: as traced (every module waits for the previous
one: the framework's order) and optimized (all passes). Prints answers and latencies side
by side and writes the graphs, the optimizer's explanation and the execution timeline.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import datasets
from ..ir import app_graphs
from ..ir.graph import PGraph
from ..optimizer import optimize
from ..runtime.runtime import Runtime, default_engine_specs
from ..runtime.values import IndexHandle
from .workloads import upload_for

SYSTEMS = ("module-order", "teola")


@dataclass
class Result:
    system: str
    question: str
    answer: str
    sources: list[str]
    latency_s: float
    query_id: str


def as_chat(graph: PGraph, max_tokens: int) -> PGraph:
    """Greedy answers, prompts sent as one user message: SmolLM2 is an instruct model and,
    given a raw prompt, often ends its turn at once (an empty answer)."""
    for prim in list(graph.nodes):
        if prim.op.value == "llm_prefill":
            graph.set_attrs(prim.name, sampling_params={"temperature": 0.0, "max_tokens": max_tokens})
        if prim.op.value == "format":
            graph.set_attrs(prim.name, chat_role="user")
    return graph


async def run_once(rt: Runtime, graph: PGraph, question: str, docs: list[Any], system: str) -> Result:
    store = rt.engines("vector_store")
    index = IndexHandle(f"demo-{uuid.uuid4().hex[:10]}", 384)
    await store.call("create_index", index.name, index.dim, route_key=index.name)
    qid = f"{system}-{uuid.uuid4().hex[:6]}"
    try:
        t0 = time.perf_counter()
        out = await rt.execute(graph, {"question": question, "docs": docs, "index": index}, query_id=qid, timeout_s=600)
        latency = time.perf_counter() - t0
    finally:  # per-query uploads leave nothing behind
        await store.call("delete_index", index.name, route_key=index.name)
    return Result(system, question, out["answer"].strip(), [h.id for h in out["sources"]], latency, qid)


def main(questions: int = 4, n_docs: int = 60, max_tokens: int = 48, out_dir: str = "out/demo",
         hosting: str = "ray") -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plain = as_chat(app_graphs.naive_rag(n_docs=n_docs, top_k=3), max_tokens)
    fast = optimize(as_chat(app_graphs.naive_rag(n_docs=n_docs, top_k=3), max_tokens))
    (out / "graph_module_order.mmd").write_text(plain.to_mermaid())
    (out / "graph_teola.mmd").write_text(fast.to_mermaid())
    (out / "explain.txt").write_text(fast.explain())

    specs = {k: v for k, v in default_engine_specs().items() if k in ("llm", "embedder", "vector_store")}
    rt = Runtime(specs, hosting=hosting)
    print(f"[demo] starting engines on {hosting} (vLLM loads in ~30-60 s on a 2-core CPU) ...", flush=True)
    t0 = time.time()
    rt.run_sync(rt.start_engines(), timeout=900)
    print(f"[demo] engines ready in {time.time() - t0:.1f} s", flush=True)
    qs = datasets.load_questions("hotpotqa-dev-500", limit=questions + 1)
    try:
        rt.run_sync(run_once(rt, fast, qs[-1].question, upload_for(qs[-1], n_docs), "warmup"), timeout=900)
        results: list[Result] = []
        for i, q in enumerate(qs[:questions]):
            docs = upload_for(q, n_docs)
            order = SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]  # alternate: neither system always goes first
            pair = {}
            for system in order:
                graph = plain if system == "module-order" else fast
                pair[system] = rt.run_sync(run_once(rt, graph, q.question, docs, system), timeout=900)
            results.extend(pair.values())
            a, b = pair["module-order"], pair["teola"]
            print(f"\nQ{i + 1}: {q.question}\n  gold: {q.answers[0]}\n  {n_docs} documents uploaded with the question")
            print(f"  module order {a.latency_s:6.2f} s  {a.answer[:150]!r}")
            print(f"  teola        {b.latency_s:6.2f} s  {b.answer[:150]!r}")
            print(f"  same sources: {a.sources == b.sources}   same answer: {a.answer == b.answer}")
        means = {s: statistics.mean(r.latency_s for r in results if r.system == s) for s in SYSTEMS}
        speedup = means["module-order"] / means["teola"]
        print(f"\n[demo] mean latency: module order {means['module-order']:.2f} s, teola {means['teola']:.2f} s "
              f"-> {speedup:.2f}x over {questions} questions")
        last = [r.query_id for r in results[-2:]]
        rt.timeline.to_png(out / "timeline.png", last, title="one question: module order vs teola")
        rt.timeline.to_chrome_trace(out / "timeline.json", last)
        print(f"[demo] wrote {out}/: graph_module_order.mmd, graph_teola.mmd, explain.txt, timeline.png, timeline.json")
        return {"means": means, "speedup": speedup, "results": results}
    finally:
        rt.shutdown()
