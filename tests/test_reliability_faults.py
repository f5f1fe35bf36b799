"""Engine actors killed mid-run (``ray.kill`` with restart) under the advanced RAG app:
first the embedder, then vLLM. Each in-flight query completes with its own result
(retried on the restarted actor) or fails with a clear error (Ray's actor error, or the
query timeout); later queries succeed; the killed actor leaves no process behind.

(tests/test_runtime.py kills the embedder under an embed-only graph; this is the whole app.)
"""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest
import ray
from ray.exceptions import RayActorError

from teola_plugin.errors import EngineRestartedError, QueryTimeoutError
from teola_plugin.langchain import TeolaRunnable
from tests.reliability import PromptSpy, build_advanced_rag, check_results, engine_state, soak_questions, wait_idle

# Kills and restarts the engine actors (vLLM reloads: ~5.5 min on 2 slow cores): `make test-all`.
pytestmark = [pytest.mark.slow, pytest.mark.extended]


def kill_mid_run(runtime, fast, questions, engine: str, when) -> list:
    """Start every query, kill ``engine``'s actor once ``when(state)`` holds, collect results."""
    actor = runtime.engines(engine).handles[0].actor

    async def main():
        tasks = [asyncio.ensure_future(fast.ainvoke(q)) for q in questions]
        for _ in range(600):  # until the queries are inside the engine (bounded: 2 min)
            await asyncio.sleep(0.2)
            state = await asyncio.wrap_future(runtime.submit(engine_state(runtime)))
            if when(state) or all(t.done() for t in tasks):
                break
        assert not all(t.done() for t in tasks), "the queries finished before the kill"
        ray.kill(actor, no_restart=False)
        return await asyncio.gather(*tasks, return_exceptions=True)

    return asyncio.run(main())


def assert_own_or_clear(questions, results, spy: PromptSpy | None = None, retriever=None) -> int:
    """Each result is its query's own (question, answer from its own prompt, documents from
    its own expansion: ``check_results``) or a clear error; returns how many completed."""
    if spy is not None:
        checks = check_results(questions, [("error", r, 0) if isinstance(r, BaseException) else ("ok", r, 0)
                                           for r in results], spy, retriever)
        assert checks == {"question": [], "answer": [], "documents": [], "duplicates": []}, checks
    ok = 0
    for q, r in zip(questions, results):
        if isinstance(r, BaseException):
            assert isinstance(r, (RayActorError, EngineRestartedError, QueryTimeoutError)), \
                f"unclear failure: {type(r).__name__}: {r}"
            assert str(r), r
        else:
            # (documents may be none: for some questions the model writes no alternative question)
            assert r["question"] == q and isinstance(r["answer"], str)
            ok += 1
    return ok


def processes_of(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def gone(procs: list[psutil.Process], timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def test_killing_the_embedder_then_vllm_mid_run_retries_or_fails_clearly(runtime, call):
    chain, _, retriever, _ = build_advanced_rag(runtime, n_passages=30, answer_tokens=12, expand_tokens=32)
    fast = TeolaRunnable(chain, runtime=runtime, timeout_s=900)
    questions = soak_questions(16, seed=5)
    spy = PromptSpy(runtime.engines("llm")).install()
    try:
        run_the_kills(runtime, call, fast, questions, spy, retriever)
    finally:
        spy.remove()


def run_the_kills(runtime, call, fast, questions, spy, retriever):
    # 1. the embedder, while queries wait on it
    before = call(runtime.engines("embedder").stats())[0]["pid"]
    results = kill_mid_run(runtime, fast, questions[:6], "embedder",
                           lambda s: s["embedder"]["running"] + s["embedder"]["queued"] > 0)
    ok_embedder = assert_own_or_clear(questions[:6], results, spy, retriever)
    assert gone(processes_of(before)) == []

    # 2. vLLM, while it generates for them (its engine-core processes must go with it)
    stats = call(runtime.engines("llm").stats())[0]
    old_procs = processes_of(stats["pid"])
    assert len(old_procs) >= 2, "vLLM's engine core runs in a child process of the actor"
    results = kill_mid_run(runtime, fast, questions[6:12], "llm", lambda s: s["llm"]["vllm_unfinished"] > 0)
    ok_llm = assert_own_or_clear(questions[6:12], results, spy, retriever)
    assert gone(old_procs) == [], "processes of the killed vLLM actor are still running"

    # 3. later queries succeed on the restarted actors, and nothing is left behind
    later = asyncio.run(_all(fast, questions[12:]))
    assert assert_own_or_clear(questions[12:], later, spy, retriever) == len(questions[12:])
    assert call(wait_idle(runtime, 60)) == {}
    print(f"completed despite the kill: embedder {ok_embedder}/6, vLLM {ok_llm}/6")


async def _all(fast, questions):
    return await asyncio.gather(*(fast.ainvoke(q) for q in questions))
