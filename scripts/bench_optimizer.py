#!/usr/bin/env python3
"""Time the full optimizer (PassManager with every pass) on graphs of 10 to 10,000 primitives.

Two shapes, as a runtime batching many queries would see them:

* ``apps``: independent applications in one PGraph (naive RAG, advanced RAG,
  search-augmented generation, round robin), each with its own documents to ingest;
* ``shared``: one ingestion, then many questions retrieving from that one index
  (high fan-out on the index handle).

Writes docs/benchmarks/optimizer.json and prints a table. Target: < 20 ms for 1,000
primitives, linear. ``with_explain`` adds reading the run's history (``explain()``), which
the manager computes only when asked. Each graph is validated once before it is timed, as
the tracers validate what they build (the manager then checks only what the passes edited).

    python scripts/bench_optimizer.py [--sizes 10 100 1000 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from teola_plugin.capture import app_graphs  # noqa: E402
from teola_plugin.capture.module_order import ModuleOrder  # noqa: E402
from teola_plugin.ir.graph import PGraph  # noqa: E402
from teola_plugin.ir.ports import PortType  # noqa: E402
from teola_plugin.optimizer import CostModel, PassContext, PassManager  # noqa: E402
from teola_plugin.optimizer.passes import PASSES  # noqa: E402

BUILDERS = (app_graphs.build_naive_rag, app_graphs.build_advanced_rag, app_graphs.build_search_augmented)


def many_apps(target: int) -> PGraph:
    g = PGraph(f"apps_{target}")
    i = 0
    while len(g) < target:
        BUILDERS[i % len(BUILDERS)](g, prefix=f"q{i}_")
        i += 1
    return g


def shared_index(target: int) -> PGraph:
    g = PGraph(f"shared_{target}")
    docs, index = g.input("docs", PortType.DOCS), g.input("index", PortType.INDEX)
    first = ModuleOrder(g)
    index = app_graphs.add_ingestion(first, docs, index, n_docs=max(10, target // 4))
    i = 0
    while len(g) < target:
        t = ModuleOrder(g)
        t.frontier = first.frontier  # each query was issued after the ingestion call returned
        question = g.input(f"q{i}", PortType.TEXT)
        hits = app_graphs.add_retrieval(t, question, index, top_k=5)
        g.output(f"answer{i}", app_graphs.add_synthesis(t, question, hits, 5))
        i += 1
    return g


SHAPES = {"apps": many_apps, "shared": shared_index}


def per_pass_ms(graph: PGraph, cost: CostModel) -> dict[str, float]:
    """Each pass alone on the output of the previous ones (no validation or history), with
    the cyclic garbage collector off as the manager runs them."""
    times: dict[str, float] = {}
    ctx_cache: dict = {}
    gc.disable()
    try:
        for name, p in PASSES.items():
            start = time.perf_counter()
            graph = p.run(graph, PassContext(cost, cost_cache=ctx_cache))
            times[name] = (time.perf_counter() - start) * 1e3
    finally:
        gc.enable()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "optimizer.json")
    args = parser.parse_args()

    cost = CostModel.default()
    manager = PassManager()
    rows = []
    for shape in args.shapes:
        for size in args.sizes:
            graph = SHAPES[shape](size)
            graph.validate()  # as a tracer hands it over
            repeat = args.repeat if size <= 1000 else max(2, args.repeat // 3)
            row = {"shape": shape, "target": size, "primitives_in": len(graph)}
            for label, explain in (("full", False), ("with_explain", True)):
                runs = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    result = manager.run(graph, cost)
                    if explain:
                        result.explain()
                    runs.append((time.perf_counter() - start) * 1e3)
                row["primitives_out"] = len(result)
                row[label] = {"ms_min": round(min(runs), 2), "ms_median": round(statistics.median(runs), 2),
                              "us_per_primitive": round(min(runs) * 1e3 / len(graph), 1)}
            row["passes_ms"] = {k: round(v, 2) for k, v in per_pass_ms(graph, cost).items()}
            rows.append(row)

    print(f"{'shape':>7} {'primitives':>10} {'after':>7} {'min ms':>9} {'median ms':>10} {'us/prim':>8}"
          f" {'min ms, with explain()':>24}")
    for r in rows:
        f, n = r["full"], r["with_explain"]
        print(f"{r['shape']:>7} {r['primitives_in']:>10} {r['primitives_out']:>7} {f['ms_min']:>9.2f} "
              f"{f['ms_median']:>10.2f} {f['us_per_primitive']:>8.1f} {n['ms_min']:>24.2f}")
    for r in rows:
        if r["target"] == max(args.sizes):
            print(f"per pass (ms), {r['shape']} {r['primitives_in']}:",
                  ", ".join(f"{k} {v:.1f}" for k, v in r["passes_ms"].items()))
    report = {
        "what": "PassManager().run(graph) on a validated graph (as a tracer hands it over): all passes and "
                "one validation of what they edited (full); "
                "with_explain also reads the history (each pass's changes and critical paths, computed "
                "when first read)",
        "shapes": {"apps": "independent naive / advanced / search-augmented apps, round robin",
                   "shared": "one ingestion, many questions retrieving from the same index"},
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "repeat": args.repeat, "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
