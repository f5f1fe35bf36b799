"""Cancellation and timeouts leave nothing behind: no vLLM request generating for nobody,
no queue entry, no engine slot, no open stream (real engines, Ray-hosted).

tests/test_runtime.py cancels a GraphRun mid-decode; these cancel through the public
LangChain entry point (``ainvoke``), time a query out while its stream is still being
opened inside the actor, and cancel requests queued inside an engine actor.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate

from teola_plugin.errors import QueryTimeoutError
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.langchain import TeolaLLM, TeolaRunnable
from tests.reliability import busy, engine_state, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture
def baseline(runtime, call):
    """What the shared engines hold before the test: each test answers for its own leftovers
    (a leak of an earlier test fails that test's own checks, not all of these)."""
    return busy(call(engine_state(runtime)))


def test_cancelling_ainvoke_aborts_its_generation_and_frees_the_engine(runtime, call, baseline):
    chain = PromptTemplate.from_template("{start}") | TeolaLLM(runtime=runtime, max_tokens=1500) | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)

    async def cancel_mid_generation():
        task = asyncio.ensure_future(fast.ainvoke({"start": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"}))
        generating = 0
        for _ in range(300):  # until vLLM is generating for it (bounded: 60 s)
            await asyncio.sleep(0.2)
            generating = (await asyncio.wrap_future(runtime.submit(engine_state(runtime))))["llm"]["vllm_unfinished"]
            if generating or task.done():
                break
        assert generating == 1 and not task.done(), "the generation should be running when cancelled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_generation())
    assert call(wait_idle(runtime, 30, baseline)) == {}  # vLLM aborted it; slots, streams, queues free
    # and the engine serves the next request normally
    assert call(runtime.engines("llm").call("generate", "Hi", {"max_tokens": 2})).text


def test_a_timeout_while_the_stream_is_being_opened_closes_it_in_the_actor(runtime, call, baseline):
    """The query times out while the actor is still prefilling (open_stream in flight): the
    stream the actor opens must not stay open, holding an engine slot and generating."""
    g = PGraph("long_prefill")
    q = g.input("question", T.TEXT)
    f = g.add("format", inputs={"question": q}, attrs={"parts": [{"var": "question"}]})
    p = g.add("llm_prefill", inputs={"prompt": f.out()},
              attrs={"sampling_params": {"temperature": 0.0, "max_tokens": 200, "ignore_eos": True}})
    g.output("text", g.add("llm_decode", inputs={"state": p.out()}).out("text"))
    for timeout in (0.05, 0.5):  # in the actor's admission / in the prefill
        # ~2,000 fresh tokens (nothing in the prefix cache): a prefill of seconds on a CPU
        long_prompt = " ".join(f"w{timeout}x{i}" for i in range(350))
        with pytest.raises(QueryTimeoutError):
            call(runtime.execute(g, {"question": long_prompt}, timeout_s=timeout))
    assert call(wait_idle(runtime, 60, baseline)) == {}


def test_cancelled_requests_queued_in_an_engine_actor_never_run(runtime, call, baseline):
    """Requests waiting in the embedder actor's queue behind a long batch are dropped there
    when their queries are cancelled (the actor is told), not run for nobody."""
    g = PGraph("embed_many")
    texts = g.input("texts", T.TEXTS)
    g.output("vectors", g.add("embed", inputs={"texts": texts}).out())
    pool = runtime.engines("embedder")
    long_text = "the quick brown fox jumps over the lazy dog " * 40
    blocker_texts = [f"{i} {long_text}" for i in range(48)]  # one full batch (item cap 48): ~1-2 s

    async def cancel_queued():
        before = sum(s["batches_run"] for s in await pool.stats())
        blocker = asyncio.create_task(runtime.execute(g, {"texts": blocker_texts}, timeout_s=120))
        await asyncio.sleep(0.05)
        doomed = [asyncio.create_task(runtime.execute(g, {"texts": [f"q{i} {long_text}"] * 40}, timeout_s=120))
                  for i in range(8)]  # 40 items each: one batch each, were they run
        await asyncio.sleep(0.3)
        for t in doomed:
            t.cancel()
        await asyncio.gather(*doomed, return_exceptions=True)
        vectors = (await blocker)["vectors"]
        left = await wait_idle(runtime, 30, baseline)
        after = sum(s["batches_run"] for s in await pool.stats())
        return vectors, left, after - before

    vectors, left, batches = call(cancel_queued())
    assert len(vectors) == 48 and left == {}
    assert batches <= 3, f"{batches} embed batches ran: cancelled requests were run anyway"


def test_a_cancel_that_crosses_the_opening_of_a_stream_leaves_no_stream_open(runtime, call, baseline):
    """A caller cancelled while the actor's answer to open_stream was on its way never learns
    the stream id (and ray.cancel then reports the call cancelled although the stream is
    open): its cancel names the request's token instead, and the actor closes the stream it
    opened for that token. A cancel that overtakes its open makes the open open nothing."""
    from teola_plugin.runtime.policies import Priority

    actor = runtime.engines("llm").handles[0].actor
    kwargs = {"prompt": "1, 2, 3,", "params": {"temperature": 0.0, "max_tokens": 1000, "ignore_eos": True}}

    async def crossing():
        answer = await actor.open_stream.remote("stream", kwargs, Priority(), "test-open-then-cancel")
        sid, finished = answer.sid, answer.finished
        opened = busy(await engine_state(runtime))
        await actor.cancel.remote(["test-open-then-cancel"])  # the answer above never reached its caller
        await actor.cancel.remote(["test-cancel-then-open"])
        late = await actor.open_stream.remote("stream", kwargs, Priority(), "test-cancel-then-open")
        return sid, finished, opened, late, await wait_idle(runtime, 30, baseline)

    sid, finished, opened, late, left = call(crossing())
    assert sid and not finished and opened["llm"]["open_streams"] >= 1
    assert late.sid == "" and late.first == [] and late.finished is True
    assert left == {}


def test_an_actors_cancel_before_its_request_arrives_answers_that_request_cancelled_once():
    """The actor's bookkeeping alone (no Ray, no engine started): a cancel can overtake the
    request it names; that request (a call or a stream opening) is then answered cancelled,
    and the token is forgotten, so it cancels nothing else later."""
    from teola_plugin.runtime.ray_hosting import EngineActor, RequestCancelled
    from teola_plugin.runtime.runtime import default_engine_specs

    actor = EngineActor(default_engine_specs()["search"])

    async def scenario() -> tuple:
        await actor.cancel(["call", "stream"])
        answered = await actor.submit_many([("call", "search", {}, None)])
        opened = await actor.open_stream("generate", {}, None, token="stream")
        return answered, opened

    [(ok, exc)], opened = asyncio.run(scenario())
    assert not ok and isinstance(exc, RequestCancelled) and "call" in str(exc)
    assert opened.finished and opened.sid == "" and opened.first == []
    assert len(actor._cancelled) == 0 and len(actor._opened) == 0
