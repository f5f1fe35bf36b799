"""Latency-vs-batch profiles of the retrieval-side engines (embedder, vector store,
reranker, BM25 search), in the format the optimizer's cost model reads
(:mod:`teola_plugin.optimizer.cost`)::

    {"profiles": {"embedder": {"embed": {"batch": [1, 8, 32, 64], "latency_s": [...]}}, ...}}

``batch`` counts the cost model's work items of one engine call: texts (embed), vectors
(vector_insert), query vectors (vector_search), hits scored for one query (rerank),
queries (search). ``latency_s`` is the median wall time of that call over ``repeats``
runs after one warm-up; each curve also carries ``throughput_per_s`` (items / latency)
and ``item`` (what was measured), which the cost model ignores.

Each ``bench_*`` coroutine takes a started engine, or starts (and closes) a default one.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import datasets
from ..engines import BM25SearchEngine, ChromaVectorStore, Hit, Reranker, SentenceTransformerEmbedder
from ..optimizer.cost import CostModel
from ..runtime.engine_tuning import tuned
from ..runtime.hosting import EngineSpec

__all__ = ["bench_embedder", "bench_vector_store", "bench_reranker", "bench_search", "bench_llm", "bench_cpu_sharing",
           "machine_meta", "write_results", "profile_engines"]

EMBED_BATCHES = (1, 8, 32, 64)
PASS_SIZES = (1, 4, 8, 16, 32, 64)  # texts in one sentence-transformers forward pass
INSERT_BATCHES = (1, 64, 256)
SEARCH_BATCHES = (1, 16, 64)
RERANK_BATCHES = (1, 16, 64)


async def _median_latency(call: Callable[[int], Awaitable[Any]], repeats: int) -> float:
    """Median wall time of ``call(i)`` for i in 1..repeats, after a warm-up ``call(0)``."""
    await call(0)
    times = []
    for i in range(1, repeats + 1):
        t0 = time.perf_counter()
        await call(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _curve(batches: Sequence[int], latencies: Sequence[float], item: str) -> dict[str, Any]:
    return {
        "batch": list(batches),
        "latency_s": [round(x, 6) for x in latencies],
        "throughput_per_s": [round(b / x, 2) if x > 0 else None for b, x in zip(batches, latencies)],
        "item": item,
    }


def _window(items: Sequence[Any], start: int, n: int) -> list[Any]:
    """``n`` items starting at ``start``, wrapping around (distinct calls see distinct items)."""
    return [items[(start + j) % len(items)] for j in range(n)]


async def _own(engine, factory):
    if engine is not None:
        return engine, False
    engine = factory()
    await engine.start()
    return engine, True


def _passages() -> list[datasets.Passage]:
    return datasets.load_corpus("squad-xquad-en")


PASSAGE_ITEM = "SQuAD paragraph (mean 784 characters, ~160 tokens)"


def runtime_embedder() -> SentenceTransformerEmbedder:
    """The embedder as a runtime configures it by default (its pass size from the profile)."""
    spec = EngineSpec("embedder", "teola_plugin.engines.embedder:SentenceTransformerEmbedder", kind="embedder")
    return tuned(spec, CostModel.default()).build()  # type: ignore[return-value]


async def bench_embedder(
    engine: SentenceTransformerEmbedder | None = None,
    batch_sizes: Sequence[int] = EMBED_BATCHES,
    repeats: int = 3,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``{"embed": curve, "embed_pass": curve}``: one ``embed`` call of b texts (default:
    SQuAD paragraphs, the size of typical RAG chunks; a short question costs about a fifth
    of one), and the time per forward pass of b texts when a call of 64 runs in such passes
    (sorted by length, as sentence-transformers does), whose most efficient b the runtime
    gives the embedder (``runtime/engine_tuning.py``)."""
    engine, owned = await _own(engine, runtime_embedder)
    try:
        pool = list(texts) if texts is not None else [p.text for p in _passages()]
        item = "text" if texts is not None else PASSAGE_ITEM
        lat = [await _median_latency(lambda i, b=b: engine.embed(_window(pool, i * b, b)), repeats) for b in batch_sizes]
        call = pool[:max(PASS_SIZES)]
        per_pass = []
        for b in PASS_SIZES:  # engines of each pass size share the loaded weights
            sized = SentenceTransformerEmbedder(engine.model_path, batch_size=b, device=engine.device)
            await sized.start()
            try:
                per_pass.append(await _median_latency(lambda i, e=sized: e.embed(call), max(1, repeats - 1))
                                * b / len(call))
            finally:
                await sized.close()
        return {"embed": _curve(batch_sizes, lat, item),
                "embed_pass": _curve(PASS_SIZES, per_pass, f"{item}, one forward pass within a call of {len(call)}")}
    finally:
        if owned:
            await engine.close()


async def bench_vector_store(
    engine: ChromaVectorStore | None = None,
    insert_batches: Sequence[int] = INSERT_BATCHES,
    search_batches: Sequence[int] = SEARCH_BATCHES,
    repeats: int = 3,
    dim: int = 384,
    base_size: int = 5000,
    k: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """``{"vector_insert": curve, "vector_search": curve}`` on an index pre-filled with
    ``base_size`` random unit vectors (about the bundled corpora's size): inserts of b new
    vectors, and one search call of b query vectors for the top ``k``."""
    engine, owned = await _own(engine, ChromaVectorStore)
    rng = np.random.default_rng(seed)

    def unit(n: int) -> np.ndarray:
        v = rng.standard_normal((n, dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    name = f"bench-{seed}-{int(time.time() * 1000)}"
    try:
        await engine.create_index(name, dim, exist_ok=False)
        base = unit(base_size)
        for s in range(0, base_size, 1000):
            chunk = base[s : s + 1000]
            await engine.insert(name, [f"base{s + j}" for j in range(len(chunk))], chunk, [""] * len(chunk))
        counter = iter(range(10**9))

        async def insert(b: int) -> None:
            vecs = unit(b)
            ids = [f"new{next(counter)}" for _ in range(b)]
            await engine.insert(name, ids, vecs, [""] * b)

        ins = [await _median_latency(lambda i, b=b: insert(b), repeats) for b in insert_batches]
        queries = unit(max(search_batches) * (repeats + 1))
        sea = [
            await _median_latency(lambda i, b=b: engine.search(name, _window(queries, i * b, b), k), repeats)
            for b in search_batches
        ]
        return {
            "vector_insert": _curve(insert_batches, ins, f"{dim}-d vector into a ~{base_size}-vector HNSW index"),
            "vector_search": _curve(search_batches, sea, f"{dim}-d query vector, top {k} of ~{base_size}"),
        }
    finally:
        try:
            await engine.delete_index(name)
        finally:
            if owned:
                await engine.close()


async def bench_reranker(
    engine: Reranker | None = None,
    batch_sizes: Sequence[int] = RERANK_BATCHES,
    repeats: int = 3,
) -> dict[str, Any]:
    """``{"rerank": curve}``: one query reranking b distinct SQuAD paragraphs."""
    engine, owned = await _own(engine, Reranker)
    try:
        ps = _passages()
        qs = datasets.load_questions("squad-xquad-en", seed=0)
        hits = [Hit(p.id, 0.0, p.text) for p in ps]
        lat = []
        for b in batch_sizes:
            lat.append(
                await _median_latency(
                    lambda i, b=b: engine.rerank(qs[i].question, _window(hits, i * b, b), top_n=min(b, 5)), repeats
                )
            )
        return {"rerank": _curve(batch_sizes, lat, f"hit scored ({engine.mode}; {PASSAGE_ITEM})")}
    finally:
        if owned:
            await engine.close()


async def bench_search(
    engine: BM25SearchEngine | None = None,
    batch_sizes: Sequence[int] = SEARCH_BATCHES,
    repeats: int = 3,
    k: int = 5,
) -> dict[str, Any]:
    """``{"search": curve}``: one call of b questions over the engine's corpus (default: the
    combined 5,098-passage corpus), top ``k`` each."""
    engine, owned = await _own(engine, BM25SearchEngine)
    try:
        qs = [q.question for q in datasets.load_questions("squad-xquad-en", seed=1)]
        lat = [
            await _median_latency(lambda i, b=b: engine.search(_window(qs, i * b, b), k), repeats)
            for b in batch_sizes
        ]
        return {"search": _curve(batch_sizes, lat, f"query, BM25 top {k} of {engine.size} passages")}
    finally:
        if owned:
            await engine.close()


PREFILL_TOKENS = (16, 128, 512, 1024)
DECODE_TOKENS = (16, 64, 128)
DECODE_CONCURRENCY = (1, 8, 32)
STALL_PREFILLS = 2  # prefills run one after another beside a decode, per stall measurement
STALL_DECODE_TOKENS = 128  # the decode they run beside: long enough to outlast them


async def bench_llm(engine=None, repeats: int = 3) -> dict[str, Any]:
    """vLLM: prefill latency vs prompt tokens (prefill-only requests on fresh prompts, so
    the prefix cache never helps), decode latency vs generated tokens of one sequence, and
    decode throughput with several sequences in flight (continuous batching)."""
    from ..engines.llm_vllm import VLLMEngine

    engine, owned = await _own(engine, VLLMEngine)
    try:
        words = " ".join(p.text for p in _passages()[:40]).split()
        nonce = iter(range(10**9))

        def prompt(tokens: int) -> str:
            # A unique first word defeats the prefix cache; ~0.75 words per token.
            start = next(nonce) * 7 % len(words)
            return f"[{next(nonce)}] " + " ".join(_window(words, start, max(1, int(tokens * 0.75))))

        prefill, prefill_tokens = [], []
        for target in PREFILL_TOKENS:
            measured: list[int] = []

            async def one_prefill(i: int, target: int = target, measured: list[int] = measured) -> None:
                res = await engine.prefill(prompt(target))
                measured.append(res.num_prompt_tokens)

            prefill.append(await _median_latency(one_prefill, repeats))
            prefill_tokens.append(int(statistics.median(measured)))
        decode = []
        for n in DECODE_TOKENS:
            params = {"temperature": 0.0, "max_tokens": n, "ignore_eos": True}

            async def one_decode(i: int, params: dict = params) -> None:
                await engine.generate(prompt(32), params)

            decode.append(await _median_latency(one_decode, repeats))
        first_token = await _median_latency(
            lambda i: engine.generate(prompt(32), {"temperature": 0.0, "max_tokens": 1}), repeats)
        per_seq = [max(0.0, d - first_token) for d in decode]
        concurrent = []
        for c in DECODE_CONCURRENCY:
            params = {"temperature": 0.0, "max_tokens": 64, "ignore_eos": True}

            async def many(i: int, c: int = c, params: dict = params) -> None:
                await asyncio.gather(*(engine.generate(prompt(32), params) for _ in range(c)))

            concurrent.append(await _median_latency(many, max(1, repeats - 1)))
        stall = [max(0.0, s) for s in await _prefill_stalls(engine, prompt, repeats)]
        return {
            "llm_prefill": _curve(prefill_tokens, prefill, "prompt tokens of one prefill-only request"),
            "llm_prefill_stall": _curve(prefill_tokens, stall,
                                        "prompt tokens of a prefill run beside a decode: the time the decode loses"),
            "llm_partial_prefill": _curve(prefill_tokens, prefill, "prompt tokens of one prefill-only request"),
            "llm_decode": _curve(list(DECODE_TOKENS), per_seq, "generated tokens of one sequence (after its first)"),
            "llm_decode_concurrent": _curve([c * 64 for c in DECODE_CONCURRENCY], concurrent,
                                            "tokens generated by 1/8/32 sequences of 64 tokens in flight at once"),
        }
    finally:
        if owned:
            await engine.close()


async def _prefill_stalls(engine, prompt: Callable[[int], str], repeats: int) -> list[float]:
    """How long a decode under way loses to one prefill of each of ``PREFILL_TOKENS`` run beside
    it: vLLM puts a prefill into its next step, which takes longer for all its sequences. Less
    than the prefill's own latency, which also holds the request's way in and out of the
    engine (the simulator holds an engine's decodes for this, not for the whole prefill)."""
    params = {"temperature": 0.0, "max_tokens": STALL_DECODE_TOKENS, "ignore_eos": True}

    async def decode_s(prefill_tokens: int | None) -> float:
        start = time.perf_counter()
        decode = asyncio.ensure_future(engine.generate(prompt(32), params))
        if prefill_tokens is not None:
            await asyncio.sleep(0.3)  # the decode is under way
            for _ in range(STALL_PREFILLS):
                await engine.prefill(prompt(prefill_tokens))
            if decode.done():
                raise RuntimeError(f"the decode ended before {STALL_PREFILLS} prefills of {prefill_tokens} tokens")
        await decode
        return time.perf_counter() - start

    alone = statistics.median([await decode_s(None) for _ in range(repeats)])
    return [(statistics.median([await decode_s(n) for _ in range(repeats)]) - alone) / STALL_PREFILLS
            for n in PREFILL_TOKENS]


SHARING_DECODE_TOKENS = 160  # the decode the embedder runs beside: several seconds on a CPU
SHARING_EMBED_TEXTS = 8  # one embed call: a forward pass of the runtime's CPU pass size


async def bench_cpu_sharing(repeats: int = 3) -> dict[str, Any]:
    """How much work two engines get done side by side on the same CPU cores, as a share of
    what each does alone: the embedder encoding passages in a loop beside a vLLM decode. Each
    keeps its own thread pool (as in the runtime), so when both run each gets less than half
    the cores' work done if the pools cost each other more than an equal share (threads
    waiting on descheduled peers, caches). ``efficiency`` is the sum of the two shares: 1.0
    is an equal, loss-free split; the simulator's processor sharing uses it."""
    from ..engines.llm_vllm import VLLMEngine

    embedder, llm = runtime_embedder(), VLLMEngine()
    await embedder.start()
    await llm.start()
    try:
        texts = [p.text for p in _passages()[:SHARING_EMBED_TEXTS]]
        params = {"temperature": 0.0, "max_tokens": SHARING_DECODE_TOKENS, "ignore_eos": True}
        nonce = iter(range(10**9))

        async def decode_s() -> float:
            start = time.perf_counter()
            await llm.generate(f"[{next(nonce)}] Write a long story about a lighthouse keeper.", params)
            return time.perf_counter() - start

        async def embed_s() -> float:
            start = time.perf_counter()
            await embedder.embed(texts)
            return time.perf_counter() - start

        await decode_s(), await embed_s()  # warm-up
        decode_alone = statistics.median([await decode_s() for _ in range(repeats)])
        embed_alone = statistics.median([await embed_s() for _ in range(max(3, repeats))])
        embed_shares, decode_shares = [], []
        for _ in range(repeats):
            decoding = asyncio.ensure_future(decode_s())
            calls, start = 0, time.perf_counter()
            while not decoding.done():  # embed calls back to back for as long as the decode runs
                await embedder.embed(texts)
                calls += 1
            embed_shares.append(embed_alone * calls / (time.perf_counter() - start))
            decode_shares.append(decode_alone / await decoding)
        embed_share, decode_share = statistics.median(embed_shares), statistics.median(decode_shares)
        return {"efficiency": round(embed_share + decode_share, 3),
                "shares": {"embedder": round(embed_share, 3), "llm": round(decode_share, 3)},
                "alone_s": {"embed": round(embed_alone, 4), "decode": round(decode_alone, 4)},
                "how": f"embed calls of {SHARING_EMBED_TEXTS} SQuAD paragraphs back to back beside one vLLM decode of "
                       f"{SHARING_DECODE_TOKENS} tokens; each share = its work done beside the other / alone, "
                       f"median of {repeats}"}
    finally:
        await llm.close()
        await embedder.close()


def machine_meta(repeats: int) -> dict[str, Any]:
    """Where and when a measurement ran: the ``meta`` of the engine benchmarks' JSON files."""
    import datetime
    import os
    import platform
    import sys

    from ..engines.cpu_dtype import describe_cpu

    return {"device": f"cpu ({os.cpu_count()} cores, {platform.machine()}, {describe_cpu()})",
            "python": sys.version.split()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "repeats": repeats}


def write_results(out_dir: str | Path, stem: str, result: Mapping[str, Any], page: str) -> Path:
    """Write a benchmark's ``STEM.json`` (the numbers) and ``STEM.md`` (its page) into
    ``out_dir``; returns the page's path."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(page)
    return out / f"{stem}.md"


def profile_engines(repeats: int = 3, which: Sequence[str] = ("embedder", "vector_store", "reranker", "search", "llm")) -> dict[str, Any]:
    """Run the benchmarks of ``which`` engines (each started and closed here) and return
    ``{"profiles": {kind: {op: curve}}}``. Blocking; do not call from a running event loop."""
    benches = {
        "embedder": bench_embedder,
        "vector_store": bench_vector_store,
        "reranker": bench_reranker,
        "search": bench_search,
        "llm": bench_llm,
    }
    unknown = set(which) - set(benches)
    if unknown:
        raise ValueError(f"unknown engine kinds {sorted(unknown)}; choose from {sorted(benches)}")

    async def run() -> dict[str, Any]:
        return {kind: await benches[kind](repeats=repeats) for kind in which}

    return {"profiles": asyncio.run(run())}
