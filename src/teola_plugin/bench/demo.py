"""`teola demo`: document QA written with plain LlamaIndex, run plain and on Teola, side by side.

The app is the benchmark's app 1 (``bench.apps.NaiveDocQA``): each HotpotQA question
brings its own upload (its 10 context paragraphs plus distractors from the bundled corpus),
which LlamaIndex indexes (``VectorStoreIndex.from_documents``: chunk -> embed -> insert)
before ``as_query_engine().query(question)``. Run once as plain LlamaIndex and once with
``Settings.executor = TeolaExecutor()``, on the same Ray-hosted engines (TeolaLLM,
TeolaEmbedding). Prints answers and latencies side by side, and writes the traced graph
(module order and optimized: PNG, Mermaid), the optimizer's explanation and the execution
timeline of the last Teola query (PNG Gantt, Chrome trace) to ``out_dir``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from ..ir.picture import to_png
from ..optimizer import optimize
from ..runtime.runtime import Runtime, default_engine_specs
from .apps import PLAIN_SEQUENTIAL, TEOLA_FULL, Answer, NaiveDocQA, Query, System

SYSTEMS = (PLAIN_SEQUENTIAL, TEOLA_FULL)
LABELS = {PLAIN_SEQUENTIAL.name: "plain LlamaIndex", TEOLA_FULL.name: "teola"}


def _timed(app: NaiveDocQA, query: Query, system: System) -> tuple[Answer, float]:
    start = time.perf_counter()
    answer = app.run(query, system)
    return answer, time.perf_counter() - start


def write_pictures(app: NaiveDocQA, query: Query, out: Path) -> None:
    """The traced graph of the app's query engine for ``query``, before and after the passes."""
    app.use(TEOLA_FULL)
    executor = app._executors[TEOLA_FULL.name]
    engine = app.query_engine(query.data["docs"], use_async=False)
    traced = executor.trace(engine)
    optimized = optimize(traced, cost_model=executor.runtime.cost_model())  # as the run plans it
    (out / "graph_module_order.mmd").write_text(traced.to_mermaid())
    (out / "graph_teola.mmd").write_text(optimized.to_mermaid())
    to_png({"module order (as traced)": traced, "teola (optimized)": optimized}, out / "graph.png")
    (out / "explain.txt").write_text(executor.explain(engine))


def main(questions: int = 3, n_docs: int = 60, max_tokens: int = 48, out_dir: str = "out/demo",
         hosting: str = "ray") -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = {k: v for k, v in default_engine_specs().items() if k in ("llm", "embedder", "vector_store")}
    rt = Runtime(specs, hosting=hosting)
    print(f"[demo] starting engines on {hosting} (vLLM loads in ~30-60 s on a 2-core CPU) ...", flush=True)
    t0 = time.time()
    rt.run_sync(rt.start_engines(), timeout=900)
    print(f"[demo] engines ready in {time.time() - t0:.1f} s", flush=True)
    app = NaiveDocQA(rt, max_tokens=max_tokens)
    app.n_docs = n_docs
    qs = app.queries(questions + 1)
    app.setup(qs)
    latencies: dict[str, list[float]] = {s.name: [] for s in SYSTEMS}
    pairs = []
    try:
        for system in SYSTEMS:  # warm-up: first calls pay one-time costs
            app.run(qs[-1], system)
        for i, q in enumerate(qs[:questions]):
            order = SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]  # neither system always goes first
            pair = {s.name: _timed(app, q, s) for s in order}
            pairs.append((q, pair))
            (a, ta), (b, tb) = pair[PLAIN_SEQUENTIAL.name], pair[TEOLA_FULL.name]
            latencies[PLAIN_SEQUENTIAL.name].append(ta)
            latencies[TEOLA_FULL.name].append(tb)
            print(f"\nQ{i + 1}: {q.question}\n  gold: {q.answers[0]}\n  {n_docs} documents uploaded with the question")
            print(f"  plain LlamaIndex {ta:6.2f} s  {a.text[:150]!r}")
            print(f"  teola            {tb:6.2f} s  {b.text[:150]!r}")
            print(f"  same sources: {a.sources == b.sources}   same answer: {a.text == b.text}")
        means = {LABELS[k]: statistics.mean(v) for k, v in latencies.items()}
        speedup = means["plain LlamaIndex"] / means["teola"]
        print(f"\n[demo] mean latency: plain LlamaIndex {means['plain LlamaIndex']:.2f} s, teola {means['teola']:.2f} s "
              f"-> {speedup:.2f}x over {questions} questions")
        last = app._executors[TEOLA_FULL.name].last_query_id
        if last is not None:
            rt.timeline.to_png(out / "timeline.png", [last], title="one question on teola: execution timeline")
            rt.timeline.to_chrome_trace(out / "timeline.json", [last])
        write_pictures(app, qs[0], out)
        print(f"[demo] wrote {out}/: graph.png, graph_module_order.mmd, graph_teola.mmd, explain.txt, "
              "timeline.png, timeline.json")
        return {"means": means, "speedup": speedup, "pairs": pairs}
    finally:
        app.use(PLAIN_SEQUENTIAL)  # Settings.executor back to None
        rt.shutdown()
