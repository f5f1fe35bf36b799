"""What Teola adds to a call that is only retrieval, as users write it: LlamaIndex's
``index.as_retriever().retrieve(q)`` with ``HuggingFaceEmbedding`` (the query embedding runs on
the runtime's embedder actor), plain vs Teola with the engine actors' direct channel vs Teola
with Ray actor calls only, interleaved in one process (rotating order, same question per round).

    .venv/bin/python scripts/bench_retrieval_overhead.py   (writes docs/benchmarks/retrieval_overhead.json)
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROUNDS = 40
QUESTIONS = ["When was the Eiffel Tower completed?", "Where is the Rosetta Stone?",
             "How many spectators did the Colosseum hold?", "Who painted the Mona Lisa?"]


def main() -> int:
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin import datasets
    from teola_plugin.capture.llama_index_models import embedder_engine_for
    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.runtime.runtime import Runtime

    Settings.embed_model = HuggingFaceEmbedding(model_name=str(default_model_path()))
    Settings.llm = None  # (LlamaIndex's MockLLM: retrieval needs no model)
    passages = datasets.load_corpus("squad-xquad-en")[:40]
    index = VectorStoreIndex.from_documents([Document(text=p.text) for p in passages])
    retriever = index.as_retriever(similarity_top_k=3)
    executors = {"teola_channel": TeolaExecutor(runtime=Runtime(direct_channel=True)),
                 "teola_ray_calls": TeolaExecutor(runtime=Runtime(direct_channel=False))}
    for ex in executors.values():
        ex.started.result()
    systems = ["plain", *executors]
    times: dict[str, list[float]] = {s: [] for s in systems}
    answers: dict[str, list[list[str]]] = {s: [] for s in systems}
    for r in range(ROUNDS + 2):
        q = QUESTIONS[r % len(QUESTIONS)]
        for s in systems[r % 3:] + systems[:r % 3]:  # rotate who goes first
            Settings.executor = executors.get(s)
            t0 = time.perf_counter()
            nodes = retriever.retrieve(q)
            elapsed = time.perf_counter() - t0
            Settings.executor = None
            if r >= 2:  # two warm-up rounds
                times[s].append(elapsed)
                answers[s].append([n.node.node_id for n in nodes])
    transports = {s: ex.runtime.engines(embedder_engine_for(ex.runtime, Settings.embed_model)[0]).handles[0].transport
                  for s, ex in executors.items()}
    for ex in executors.values():
        ex.runtime.shutdown()
    plain_ms = statistics.median(times["plain"]) * 1e3
    report = {
        "command": "python scripts/bench_retrieval_overhead.py",
        "machine": f"{platform.machine()}, python {sys.version.split()[0]}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": ROUNDS,
        "transports": transports,
        "same_nodes_as_plain": {s: answers[s] == answers["plain"] for s in executors},
        "median_ms": {s: round(statistics.median(v) * 1e3, 2) for s, v in times.items()},
        "p90_ms": {s: round(sorted(v)[int(0.9 * len(v))] * 1e3, 2) for s, v in times.items()},
        "ratio_to_plain": {s: round(statistics.median(times[s]) * 1e3 / plain_ms, 3) for s in executors},
    }
    out = Path("docs/benchmarks/retrieval_overhead.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
