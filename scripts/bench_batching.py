"""Cross-query batching on the real engines: the same retrieval queries one at a time vs
all at once, with the engine batch-size histogram read from the execution timeline.

    .venv/bin/python scripts/bench_batching.py [--queries 32]
    -> docs/benchmarks/batching.json, docs/benchmarks/batching.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from teola_plugin import datasets
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.runtime.runtime import Runtime, default_engine_specs
from teola_plugin.runtime.values import IndexHandle

ENGINES = ("embedder", "vector_store", "reranker")


def retrieval_graph() -> PGraph:
    g = PGraph("retrieve_rerank")
    q = g.input("question", T.TEXT)
    index = g.input("index", T.INDEX)
    qs = g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"})
    e = g.add("embed", inputs={"texts": qs.out()})
    s = g.add("vector_search", inputs={"index": index, "vectors": e.out()}, attrs={"top_k": 8})
    hits = g.add("aggregate", inputs={"in0": s.out()}, attrs={"mode": "pick", "index": 0})
    g.output("hits", g.add("rerank", inputs={"query": q, "hits": hits.out()}, attrs={"top_n": 3}).out())
    return g


async def setup_index(rt: Runtime) -> IndexHandle:
    passages = datasets.load_corpus("squad-xquad-en")
    index = IndexHandle("bench-squad", 384)
    store, embedder = rt.engines("vector_store"), rt.engines("embedder")
    await store.call("create_index", index.name, index.dim, route_key=index.name)
    vectors = await embedder.call("embed", [p.text for p in passages])
    await store.call("insert", index.name, [p.id for p in passages], vectors, [p.text for p in passages],
                     route_key=index.name)
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=32)
    args = ap.parse_args(argv)
    rt = Runtime({k: v for k, v in default_engine_specs().items() if k in ENGINES})
    graph = retrieval_graph()
    questions = [q.question for q in datasets.load_questions("squad-xquad-en", limit=args.queries, seed=1)]
    report: dict = {"machine": f"{platform.machine()} cpu, python {sys.version.split()[0]}",
                    "command": "python scripts/bench_batching.py", "queries": len(questions)}
    try:
        rt.run_sync(rt.start_engines(), timeout=600)
        index = rt.run_sync(setup_index(rt), timeout=600)

        async def one(q: str) -> float:
            t0 = time.perf_counter()
            await rt.execute(graph, {"question": q, "index": index}, timeout_s=300)
            return time.perf_counter() - t0

        async def all_at_once() -> list[float]:
            return list(await asyncio.gather(*(one(q) for q in questions)))

        rt.run_sync(one("warm up"))
        for mode in ("sequential", "concurrent"):
            rt.timeline.clear()
            t0 = time.perf_counter()
            if mode == "sequential":
                lat = [rt.run_sync(one(q), timeout=600) for q in questions]
            else:
                lat = rt.run_sync(all_at_once(), timeout=600)
            wall = time.perf_counter() - t0
            report[mode] = {
                "wall_s": round(wall, 3), "mean_latency_s": round(statistics.mean(lat), 4),
                "throughput_qps": round(len(questions) / wall, 2),
                "batches": {e: dict(sorted(rt.timeline.batch_sizes(e).items())) for e in ENGINES},
                "engine_busy_s": {e: round(busy(rt, e), 3) for e in ENGINES},
            }
    finally:
        rt.shutdown()
    out = Path("docs/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    (out / "batching.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "batching.png")
    print(json.dumps(report, indent=2))
    return 0


def busy(rt: Runtime, engine: str) -> float:
    """Seconds the engine spent running batches (each batch counted once)."""
    batches = {(s.batch_id): (s.start, s.end) for s in rt.timeline.spans() if s.engine == engine and s.batch_id >= 0}
    return sum(end - start for start, end in batches.values())


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ENGINES), figsize=(12, 3.2))
    for ax, engine in zip(axes, ENGINES):
        for mode, color in (("sequential", "tab:grey"), ("concurrent", "tab:blue")):
            hist = {int(k): v for k, v in report[mode]["batches"][engine].items()}
            ax.bar([str(k) for k in hist], list(hist.values()), color=color, alpha=0.7, label=mode)
        ax.set_title(f"{engine}: batches by size")
        ax.set_xlabel("requests per engine call")
    axes[0].set_ylabel("engine calls")
    axes[0].legend()
    fig.suptitle(f"{report['queries']} queries: sequential {report['sequential']['wall_s']} s, "
                 f"concurrent {report['concurrent']['wall_s']} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
