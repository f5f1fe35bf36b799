"""Shared by the reliability tests (tests/test_reliability_*.py) and scripts/soak.py:
what "idle" means for the engines, process memory, Ray object-store use, and the advanced
RAG app (LangChain MultiQueryRetriever -> prompt -> chat model) they load."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

QA_TEMPLATE = ("You are a helpful assistant. Answer the question using only the context "
               "below, in one short sentence.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")


async def engine_state(runtime: Any) -> dict[str, dict[str, int]]:
    """Per engine, summed over replicas: queued / queue entries / slots taken / open streams;
    for the LLM also vLLM's unfinished requests. All zero = nothing left behind."""
    state: dict[str, dict[str, int]] = {}
    for name, pool in list(runtime._pools.items()):
        stats = await pool.stats()
        state[name] = {k: sum(int(s.get(k, 0)) for s in stats)
                       for k in ("queued", "queue_entries", "running", "open_streams")}
        state[name]["outstanding"] = sum(h.outstanding for h in pool.handles)
        if name == "llm":
            state[name]["vllm_unfinished"] = await pool.call("unfinished_requests")
    return state


def busy(state: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {e: {k: v for k, v in s.items() if v} for e, s in state.items() if any(s.values())}


async def wait_idle(runtime: Any, timeout_s: float = 60.0,
                    baseline: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """Poll until every engine is back to ``baseline`` (default: idle) or ``timeout_s``
    passed; returns what is busy beyond the baseline ({} when settled). Bounded polling,
    not a speed assertion: callers assert the result."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = beyond(busy(await engine_state(runtime)), baseline or {})
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.2)


def beyond(state: dict[str, dict[str, int]], baseline: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What ``state`` holds above ``baseline``: a test's own leftovers, not earlier tests'."""
    out = {e: {k: v - baseline.get(e, {}).get(k, 0) for k, v in s.items()} for e, s in state.items()}
    return {e: {k: v for k, v in s.items() if v > 0} for e, s in out.items() if any(v > 0 for v in s.values())}


# -- memory -------------------------------------------------------------------------------------
def rss_bytes(pid: int, with_children: bool = True) -> int:
    """Resident memory of a process (and its children: vLLM's engine-core processes)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc] + (proc.children(recursive=True) if with_children else [])
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total
    except psutil.NoSuchProcess:
        return 0


async def actor_pids(runtime: Any) -> dict[str, int]:
    pids = {}
    for name, pool in list(runtime._pools.items()):
        for i, s in enumerate(await pool.stats()):
            if s.get("pid") and s["pid"] != os.getpid():
                pids[f"{name}[{i}]"] = int(s["pid"])
    return pids


def object_store_used_bytes() -> int | None:
    """Bytes held in this node's Ray object store (None without Ray)."""
    import ray

    if not ray.is_initialized():
        return None
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


async def memory_snapshot(runtime: Any) -> dict[str, Any]:
    pids = await actor_pids(runtime)
    return {"driver_rss": rss_bytes(os.getpid(), with_children=False),
            "actors_rss": {k: rss_bytes(p) for k, p in pids.items()},
            "object_store_used": object_store_used_bytes(),
            "timeline_queries": len(runtime.timeline.query_ids()),
            "timeline_spans": len(runtime.timeline)}


def mib(n: float) -> float:
    return round(n / 2**20, 1)


# -- the advanced RAG app ------------------------------------------------------------------------
def build_advanced_rag(runtime: Any, n_passages: int = 60, answer_tokens: int = 16, expand_tokens: int = 40):
    """Multi-query RAG in LangChain, traced and scheduled by Teola: the question is expanded
    into several queries by the LLM (streamed; each line retrieved as it is decoded),
    their hits are unioned, and the answer is generated from them. Returns (chain, fast,
    retriever, chat). The output carries the question, the documents and the answer."""
    from langchain_classic.retrievers.multi_query import MultiQueryRetriever
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    from teola_plugin import datasets
    from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaLLM, TeolaRunnable

    passages = datasets.load_corpus("squad-xquad-en")[:n_passages]
    store = InMemoryVectorStore(TeolaEmbeddings(runtime=runtime))
    store.add_texts([p.text for p in passages], metadatas=[{"title": p.title} for p in passages],
                    ids=[p.id for p in passages])
    retriever = store.as_retriever(search_kwargs={"k": 2})
    expander = TeolaLLM(runtime=runtime, max_tokens=expand_tokens)
    multi = MultiQueryRetriever.from_llm(retriever=retriever, llm=expander)
    chat = TeolaChatModel(runtime=runtime, max_tokens=answer_tokens)
    prompt = ChatPromptTemplate.from_template(QA_TEMPLATE)
    answer = (RunnableLambda(lambda x: {"context": format_docs(x["context"]), "question": x["question"]})
              | prompt | chat | StrOutputParser())
    chain = ({"context": multi, "question": RunnablePassthrough()} | RunnablePassthrough.assign(answer=answer))
    return chain, TeolaRunnable(chain, runtime=runtime), retriever, chat


def format_docs(docs: list[Any]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def soak_questions(n: int, seed: int = 7) -> list[str]:
    """``n`` distinct bundled questions (no one a substring of another: prompts are told
    apart by the question they contain)."""
    from teola_plugin import datasets

    pool = [q.question.strip() for q in datasets.load_questions("squad-xquad-en", limit=10_000, seed=seed)]
    out: list[str] = []
    for q in pool:
        if q and all(q not in o and o not in q for o in out):
            out.append(q)
        if len(out) == n:
            return out
    # More asked than the corpus has: number the repeats so each stays unique.
    base = list(out)
    i = 0
    while len(out) < n:
        out.append(f"{base[i % len(base)]} (variant {i // len(base) + 1})")
        i += 1
    return out


class PromptSpy:
    """Records, on the LLM pool, every stream's prompt and the text generated for it, so a
    query's answer can be matched to the prompt that produced it (mix-up detection)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.generated: dict[str, str] = {}  # prompt (repr) -> text
        self._sid_prompt: dict[str, str] = {}
        self._orig = (pool.open_stream, pool.resume_stream)

    def install(self) -> "PromptSpy":
        open_stream, resume_stream = self._orig

        async def spy_open(method: str, kwargs: Any, *args: Any, **kw: Any):
            opened = await open_stream(method, kwargs, *args, **kw)
            key = prompt_text(kwargs["prompt"])
            self.generated[key] = "".join(d.text for d in opened.first)
            if not opened.finished:
                self._sid_prompt[opened.sid] = key
            return opened

        async def spy_resume(sid: str):
            key = self._sid_prompt.pop(sid, None)
            async for delta in resume_stream(sid):
                if key is not None:
                    self.generated[key] += delta.text
                yield delta

        self.pool.open_stream, self.pool.resume_stream = spy_open, spy_resume
        return self

    def remove(self) -> None:
        del self.pool.open_stream, self.pool.resume_stream  # back to the class's methods

    def prompts_with(self, text: str) -> list[str]:
        return [k for k in self.generated if text in k]


def prompt_text(prompt: Any) -> str:
    """A prompt as searchable text: a string as is, chat messages' contents joined."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m["content"]) for m in prompt)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


# -- the soak ------------------------------------------------------------------------------------
async def _timed_batch(fast: Any, questions: list[str]) -> float:
    t0 = time.monotonic()
    await asyncio.gather(*(fast.ainvoke(q) for q in questions))
    return time.monotonic() - t0


async def _closed_loop_throughput(fast: Any, questions: list[str], concurrency: int) -> float:
    """Steady-state queries/s with ``concurrency`` queries always in flight: completions per
    second over the second half of the run (the first half fills the pipeline)."""
    pending = list(questions)
    done: list[float] = []

    async def worker() -> None:
        while pending:
            await fast.ainvoke(pending.pop())
            done.append(time.monotonic())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    half = len(done) // 2
    return (len(done) - half) / max(1e-6, done[-1] - done[half - 1])


def run_soak(runtime: Any, n_queries: int, *, rate_factor: float = 2.0, seed: int = 0, timeout_s: float = 120.0,
             saturation_probe: int = 12, checkpoints: int = 4, log: Any = print) -> dict[str, Any]:
    """Open-loop Poisson load on the advanced RAG app at ``rate_factor`` x its measured
    saturation throughput; returns counts, checks and memory per checkpoint.

    Saturation = steady-state queries per second of a closed loop that keeps
    ``saturation_probe`` queries in flight (3 x that many queries; the second half is
    measured, so pipelining across queries counts). Each load query is a fresh
    ``ainvoke`` started at its Poisson arrival time, bounded by ``timeout_s``
    (``QueryTimeoutError``). What counts as correct is in :func:`check_results`.
    """
    import random

    from teola_plugin.errors import QueryTimeoutError
    from teola_plugin.langchain import TeolaRunnable

    chain, fast, retriever, chat = build_advanced_rag(runtime)
    fast = TeolaRunnable(chain, runtime=runtime, timeout_s=timeout_s)
    spy = PromptSpy(runtime.engines("llm")).install()
    try:
        warm = soak_questions(3 * saturation_probe + 4, seed=seed + 1000)
        asyncio.run(_timed_batch(fast, warm[:4]))  # trace, optimize, first batches
        saturation = asyncio.run(_closed_loop_throughput(fast, warm[4:], saturation_probe))
        rate = rate_factor * saturation
        log(f"saturation ~{saturation:.2f} queries/s ({saturation_probe} in flight, closed loop); "
            f"offering {rate:.2f}/s, {n_queries} queries")
        questions = soak_questions(n_queries, seed=seed)
        rng = random.Random(seed)
        arrivals, t = [], 0.0
        for _ in questions:
            t += rng.expovariate(rate)
            arrivals.append(t)
        spy.generated.clear()
        memory = [{"after_queries": 0, **call_on(runtime, memory_snapshot(runtime))}]
        marks = {round(n_queries * (i + 1) / checkpoints) for i in range(checkpoints)}

        async def one(q: str, at: float, t0: float) -> tuple[str, Any, float]:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            start = time.monotonic()
            try:
                return "ok", await fast.ainvoke(q), time.monotonic() - start
            except QueryTimeoutError as exc:
                return "timeout", exc, time.monotonic() - start
            except Exception as exc:  # anything else is a failure of the test
                return "error", exc, time.monotonic() - start

        async def load() -> list[tuple[str, Any, float]]:
            t0 = time.monotonic()
            tasks = [asyncio.ensure_future(one(q, at, t0)) for q, at in zip(questions, arrivals)]
            done = 0
            for fut in asyncio.as_completed(tasks):
                await fut
                done += 1
                if done in marks and done < n_queries:
                    memory.append({"after_queries": done, **await asyncio.wrap_future(
                        runtime.submit(memory_snapshot(runtime)))})
            return [t.result() for t in tasks]

        t0 = time.monotonic()
        results = asyncio.run(load())
        wall = time.monotonic() - t0
        left = call_on(runtime, wait_idle(runtime, 60))
        memory.append({"after_queries": n_queries, **call_on(runtime, memory_snapshot(runtime))})
    finally:
        spy.remove()
    checks = check_results(questions, results, spy, retriever)
    latencies = sorted(r[2] for r in results if r[0] == "ok")
    return {
        "queries": n_queries, "saturation_qps": round(saturation, 3), "offered_qps": round(rate, 3),
        "wall_s": round(wall, 1), "ok": sum(r[0] == "ok" for r in results),
        "timeouts": sum(r[0] == "timeout" for r in results),
        "errors": [f"{type(r[1]).__name__}: {r[1]}" for r in results if r[0] == "error"],
        "latency_p50_s": round(latencies[len(latencies) // 2], 2) if latencies else None,
        "latency_max_s": round(latencies[-1], 2) if latencies else None,
        "left_busy": left, "checks": checks, "memory": memory,
    }


def call_on(runtime: Any, coro: Any, timeout: float = 300) -> Any:
    return runtime.run_sync(coro, timeout=timeout)


def check_results(questions: list[str], results: list[tuple[str, Any, float]], spy: PromptSpy,
                  retriever: Any) -> dict[str, Any]:
    """What "its own correct answer" means here (greedy answers under batching may differ
    from a run alone by a token, so the text is not compared to a solo run). For each
    completed query:

    * ``question``: the output carries its own question;
    * ``answer``: the answer is exactly the text vLLM generated for the one answer prompt
      that contains this question, and that prompt holds exactly this output's documents;
    * ``documents``: the documents are what the expansion lines generated for this
      question retrieve when searched alone, after the run;
    * ``duplicates``: no question had more than one expansion or answer prompt.

    Any cross-query mix-up (a result, hit list or stream routed to another query) breaks
    one of these. Returns the failures per check (all empty = correct)."""
    from langchain_classic.retrievers.multi_query import _unique_documents

    from teola_plugin.ir.semantics import parse_items

    bad: dict[str, list[str]] = {"question": [], "answer": [], "documents": [], "duplicates": []}
    expansions: dict[int, list[str]] = {}
    for i, (q, (status, out, _)) in enumerate(zip(questions, results)):
        prompts = spy.prompts_with(q)
        answer_prompts = [p for p in prompts if "Context:" in p]
        expansion_prompts = [p for p in prompts if "Context:" not in p]
        if len(answer_prompts) > 1 or len(expansion_prompts) > 1:
            bad["duplicates"].append(q)
        if status != "ok":
            continue
        if out.get("question") != q:
            bad["question"].append(q)
        if (len(answer_prompts) != 1 or spy.generated[answer_prompts[0]] != out.get("answer")
                or format_docs(out["context"]) not in answer_prompts[0]):
            bad["answer"].append(q)
        if len(expansion_prompts) == 1:
            expansions[i] = parse_items(spy.generated[expansion_prompts[0]], "lines")
        else:
            bad["documents"].append(q)
    lines = [line for i in sorted(expansions) for line in expansions[i]]
    store = retriever.vectorstore
    vectors = store.embedding.embed_documents(lines) if lines else []
    hits = iter([store.similarity_search_by_vector(v, k=retriever.search_kwargs.get("k", 4)) for v in vectors])
    for i in sorted(expansions):
        alone = _unique_documents([d for _ in expansions[i] for d in next(hits)])
        if [d.id for d in alone] != [d.id for d in results[i][1]["context"]]:
            bad["documents"].append(questions[i])
    return bad
