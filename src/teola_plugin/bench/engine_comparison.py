"""Each engine against the best configuration of its own library, side by side in one run.

An engine is worth hosting only if it runs at its library's best on the machine. For the
embedder that means the sentence-transformers pass size (a CPU runs big passes slower per
text) and the threads a Ray actor gets (Ray sets ``OMP_NUM_THREADS=1`` unless told); for
the vector store, chromadb's own calls. Each measurement embeds or stores the same data
the same number of times; the best of ``repeats`` runs counts (the machine's noise only
ever adds time).

    .venv/bin/python scripts/compare_engines.py   # writes docs/benchmarks/engines.{json,md}
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from .. import datasets
from ..engines.embedder import SentenceTransformerEmbedder, default_model_path
from ..engines.vector_store import ChromaVectorStore
from ..runtime.policies import Priority
from .engine_profiles import runtime_embedder

__all__ = ["compare_embedder", "compare_vector_store", "compare_engines", "PASS_SIZES"]

PASS_SIZES = (1, 4, 8, 16, 32, 64)
CALL_SIZES = (1, 8, 32, 64)  # texts in one engine call


def _best_time(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


async def _abest_time(run: Callable[[], Awaitable[Any]], repeats: int) -> float:
    await run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await run()
        times.append(time.perf_counter() - t0)
    return min(times)


def _rate(items: int, seconds: float) -> float:
    return round(items / seconds, 2)


def compare_embedder(n_texts: int = 64, repeats: int = 2, pass_sizes: Sequence[int] = PASS_SIZES,
                     call_sizes: Sequence[int] = CALL_SIZES, ray: bool = True) -> dict[str, Any]:
    """Texts per second embedding ``n_texts`` SQuAD paragraphs: the library at each pass
    size (``SentenceTransformer.encode(batch_size=b)``), the engine as the runtime
    configures it (in this process and in a Ray actor) and at sentence-transformers'
    default pass size, and the tuned engine's rate per call size."""
    from sentence_transformers import SentenceTransformer

    texts = [p.text for p in datasets.load_corpus("squad-xquad-en")[:n_texts]]
    model = SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)
    library = {b: _rate(len(texts), _best_time(
        lambda b=b: model.encode(texts, batch_size=b, normalize_embeddings=True), repeats)) for b in pass_sizes}
    best_pass = max(library, key=library.__getitem__)
    del model

    tuned_engine = runtime_embedder()

    async def engine_rates() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, engine in (("engine", tuned_engine),
                              ("engine_library_default", SentenceTransformerEmbedder(batch_size=32))):
            await engine.start()
            try:
                out[label] = _rate(len(texts), await _abest_time(lambda e=engine: e.embed(texts), repeats))
                if label == "engine":
                    out["engine_per_call"] = {
                        n: _rate(n, await _abest_time(lambda e=engine, n=n: e.embed(texts[:n]), repeats))
                        for n in call_sizes}
            finally:
                await engine.close()
        return out

    result: dict[str, Any] = {
        "item": "SQuAD paragraph (mean 784 characters, ~160 tokens)", "texts": len(texts),
        "library_per_pass_size": library, "library_best": {"pass_size": best_pass, "texts_per_s": library[best_pass]},
        "engine_pass_size": tuned_engine.batch_size, **asyncio.run(engine_rates()),
    }
    if ray:
        result["engine_ray_actor"] = _rate(len(texts), _ray_embed_time(texts, repeats))
    return result


def _ray_embed_time(texts: list[str], repeats: int) -> float:
    """The runtime's own embedder in its Ray actor, one request of every text."""
    from ..runtime.runtime import Runtime, default_engine_specs

    runtime = Runtime({"embedder": default_engine_specs()["embedder"]}, hosting="ray")
    try:
        pool = runtime.run_sync(runtime.start_engines("embedder"))["embedder"]

        async def once() -> None:
            await pool.submit("embed", {"texts": texts}, Priority())

        return runtime.run_sync(_abest_time(once, repeats))
    finally:
        runtime.shutdown()


def compare_vector_store(n: int = 2000, dim: int = 384, queries: int = 16, k: int = 10,
                         repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Inserts per second (``n`` vectors, in calls of 256) and queries per second (one call
    of ``queries`` vectors, top ``k``): chromadb's own client against the engine, after one
    untimed fill each, taking turns (who goes first alternates) with each filled index dropped
    once timed. A fill of 2,000 vectors varies 1.5x within one process on this machine (the
    process's first ones fastest, later ones slower as it has held more indexes), so timing
    all of one side first charged that to the other (the engine's inserts read 1.29x slower
    than the library's)."""
    import chromadb
    import chromadb.config

    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    qs = vecs[:queries] + 0.01
    # the engine's index settings (its default HNSW build is denser than chromadb's, for recall)
    engine_settings = ChromaVectorStore()
    hnsw = {"space": "cosine", "ef_construction": engine_settings.ef_construction,
            "max_neighbors": engine_settings.max_neighbors, "ef_search": engine_settings.ef_search}
    client = chromadb.EphemeralClient(settings=chromadb.config.Settings(anonymized_telemetry=False))

    def library_fill(name: str) -> Any:
        coll = client.create_collection(name, configuration={"hnsw": hnsw}, embedding_function=None)
        for s in range(0, n, 256):
            ids = [f"v{j}" for j in range(s, min(n, s + 256))]
            coll.add(ids=ids, embeddings=vecs[s:s + 256], documents=[""] * len(ids))
        return coll

    async def engine_fill(engine: ChromaVectorStore, name: str) -> None:
        await engine.create_index(name, dim, exist_ok=False)
        for s in range(0, n, 256):
            chunk = vecs[s:s + 256]
            await engine.insert(name, [f"v{j}" for j in range(s, s + len(chunk))], chunk, [""] * len(chunk))

    async def measure() -> tuple[float, float, float, float]:
        engine = ChromaVectorStore()
        await engine.start()
        times: dict[str, float] = dict.fromkeys(("lib_insert", "eng_insert", "lib_query", "eng_query"), float("inf"))

        def keep(key: str, seconds: float) -> None:
            times[key] = min(times[key], seconds)

        async def library_turn(name: str, timed: bool) -> None:
            start = time.perf_counter()
            coll = library_fill(name)
            if timed:
                keep("lib_insert", time.perf_counter() - start)
                keep("lib_query", _best_time(lambda: coll.query(query_embeddings=qs, n_results=k), repeats))
            client.delete_collection(name)

        async def engine_turn(name: str, timed: bool) -> None:
            start = time.perf_counter()
            await engine_fill(engine, name)
            if timed:
                keep("eng_insert", time.perf_counter() - start)
                keep("eng_query", await _abest_time(lambda: engine.search(name, qs, k), repeats))
            await engine.delete_index(name)

        try:
            await library_turn("lib-warm", False)  # the process's first fills pay one-time costs
            await engine_turn("eng-warm", False)
            for i in range(repeats):  # who goes first alternates: neither always finds the fresher process
                turns = (library_turn(f"lib{i}", True), engine_turn(f"eng{i}", True))
                for turn in turns if i % 2 == 0 else turns[::-1]:
                    await turn
        finally:
            await engine.close()
        return times["lib_insert"], times["eng_insert"], times["lib_query"], times["eng_query"]

    lib_insert, eng_insert, lib_query, eng_query = asyncio.run(measure())
    return {"item": f"{dim}-d unit vector; {n} inserted in calls of 256; one search call of {queries} queries, top {k}; "
                    f"both with the engine's HNSW settings {hnsw}, taking turns, each index dropped once timed",
            "library": {"inserts_per_s": _rate(n, lib_insert), "queries_per_s": _rate(queries, lib_query)},
            "engine": {"inserts_per_s": _rate(n, eng_insert), "queries_per_s": _rate(queries, eng_query)}}


def compare_engines(repeats: int = 2, ray: bool = True) -> dict[str, Any]:
    """Every comparison above. Blocking; do not call from a running event loop."""
    return {"embedder": compare_embedder(repeats=repeats, ray=ray),
            "vector_store": compare_vector_store(repeats=max(repeats, 2))}
