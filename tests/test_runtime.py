"""The two-layer scheduler on the real engines (Ray-hosted, shared by the session)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from teola_plugin import datasets
from teola_plugin.errors import QueryTimeoutError
from teola_plugin.capture import app_graphs
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.optimizer import optimize
from teola_plugin.runtime import engine_channel
from teola_plugin.runtime.values import Document, IndexHandle

pytestmark = pytest.mark.slow


def hotpot_docs(question, extra: int = 20) -> list[Document]:
    """The question's 10-paragraph context plus distractors from the corpus."""
    corpus = {p.id: p for p in datasets.load_corpus("hotpotqa-dev-500")}
    ids = list(question.context_ids) + [pid for pid in list(corpus)[-extra:] if pid not in question.context_ids]
    return [Document(pid, f"{corpus[pid].title}: {corpus[pid].text}", {"title": corpus[pid].title}) for pid in ids]


def new_index(runtime, call, dim: int = 384) -> IndexHandle:
    name = f"q-{uuid.uuid4().hex[:10]}"
    call(runtime.engines("vector_store").call("create_index", name, dim, route_key=name))
    return IndexHandle(name, dim)


def small_answers(graph: PGraph, max_tokens: int = 24) -> PGraph:
    """Short greedy generations keep the suite fast; the graph is otherwise unchanged."""
    for prim in list(graph.nodes):
        if prim.op.value == "llm_prefill":
            graph.set_attrs(prim.name, sampling_params={"temperature": 0.0, "max_tokens": max_tokens})
    return graph


def test_optimized_naive_rag_returns_what_the_unoptimized_graph_returns(runtime, call):
    question = datasets.load_questions("hotpotqa-dev-500", limit=1)[0]
    docs = hotpot_docs(question, extra=40)  # enough documents that splitting ingestion pays
    plain = small_answers(app_graphs.naive_rag(n_docs=len(docs), top_k=3))
    fast = small_answers(optimize(app_graphs.naive_rag(n_docs=len(docs), top_k=3)))
    assert any(p.shard for p in fast.nodes), "stage decomposition should have split ingestion"
    out_plain = call(runtime.execute(plain, {"question": question.question, "docs": docs,
                                             "index": new_index(runtime, call)}, timeout_s=120))
    out_fast = call(runtime.execute(fast, {"question": question.question, "docs": docs,
                                           "index": new_index(runtime, call)}, timeout_s=120))
    assert [h.id for h in out_fast["sources"]] == [h.id for h in out_plain["sources"]]
    assert len(out_plain["sources"]) == 3
    assert out_fast["answer"] == out_plain["answer"] and out_plain["answer"].strip()
    # every chunk of every document was inserted, none twice
    assert set(h.id.split("#")[0] for h in out_plain["sources"]) <= {d.id for d in docs}


def test_decode_pipelining_starts_retrieval_before_the_expansion_finishes(runtime, call):
    question = datasets.load_questions("hotpotqa-dev-500", limit=3)[2]
    docs = hotpot_docs(question, extra=10)
    graph = small_answers(optimize(app_graphs.advanced_rag(num_queries=3, top_k=3, rerank_top_n=2,
                                                           n_docs=len(docs))), max_tokens=64)
    decode = next(p for p in graph.nodes if p.attrs.get("stream_items"))
    qid = f"pipelined-{uuid.uuid4().hex[:6]}"
    out = call(runtime.execute(graph, {"question": question.question, "docs": docs,
                                       "index": new_index(runtime, call)}, query_id=qid, timeout_s=180))
    spans = runtime.timeline.spans([qid])
    decode_span = next(s for s in spans if s.node == decode.name)
    item_embeds = [s for s in spans if s.op == "embed" and graph[s.node].attrs.get("stream_from") == decode.name]
    assert len(out["sources"]) == 2
    # greedy decoding writes three lines for this question: one embed per line, and the
    # first started while the expansion was still decoding
    assert len(item_embeds) >= 2, "each expanded query should be embedded as its own item"
    assert min(s.start for s in item_embeds) < decode_span.end - 0.1


def test_concurrent_queries_never_mix_results(runtime, call):
    questions = datasets.load_questions("squad-xquad-en", limit=100)
    g = PGraph("echo_search")
    q = g.input("question", T.TEXT)
    qs = g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"})
    s = g.add("search", inputs={"queries": qs.out()}, attrs={"top_k": 3})
    e = g.add("embed", inputs={"texts": qs.out()})
    g.output("hits", s.out())
    g.output("vectors", e.out())
    g.output("question", q)

    async def all_at_once():
        return await asyncio.gather(*(runtime.execute(g, {"question": x.question}, timeout_s=120) for x in questions))

    outs = call(all_at_once())
    alone = call(runtime.engines("search").call("search", [x.question for x in questions], 3))
    for x, out, expected in zip(questions, outs, alone):
        assert out["question"] == x.question
        assert [h.id for h in out["hits"][0]] == [h.id for h in expected]
    emb = call(runtime.engines("embedder").call("embed", [questions[7].question]))
    assert abs(float(outs[7]["vectors"][0] @ emb[0]) - 1.0) < 1e-4
    assert max(runtime.timeline.batch_sizes("search")) > 1  # queries shared engine batches


def test_an_error_fails_its_query_only_with_the_original_type_and_the_primitive_named(runtime, call):
    def broken(**_):
        raise KeyError("component exploded")

    g = PGraph("err")
    q = g.input("question", T.TEXT)
    op = g.add("opaque", name="custom_step", inputs={"x": q}, attrs={"fn": broken}, origin="MyPostprocessor")
    g.output("out", op.out())
    ok = PGraph("ok")
    q2 = ok.input("question", T.TEXT)
    ok.output("out", ok.add("aggregate", inputs={"in0": q2}, attrs={"mode": "list"}).out())

    async def both():
        return await asyncio.gather(runtime.execute(g, {"question": "a"}), runtime.execute(ok, {"question": "b"}),
                                    return_exceptions=True)

    bad, good = call(both())
    assert isinstance(bad, KeyError) and "component exploded" in str(bad)
    assert any("custom_step" in n and "MyPostprocessor" in n for n in bad.__notes__)
    assert good == {"out": ["b"]}


def test_a_query_past_its_timeout_fails_fast_and_clearly(runtime, call):
    g = PGraph("slow")
    q = g.input("question", T.TEXT)
    g.output("out", g.add("opaque", name="sleeper", inputs={"x": q},
                          attrs={"fn": lambda x: time.sleep(3) or x}).out())
    t0 = time.time()
    with pytest.raises(QueryTimeoutError, match="sleeper"):
        call(runtime.execute(g, {"question": "a"}, timeout_s=0.3))
    assert time.time() - t0 < 2.5


def test_cancelling_a_query_aborts_its_generation(runtime, call):
    g = PGraph("long")
    q = g.input("question", T.TEXT)
    f = g.add("format", inputs={"question": q}, attrs={"parts": ["Count from 1 to 5000: ", {"var": "question"}]})
    p = g.add("llm_prefill", inputs={"prompt": f.out()}, attrs={"sampling_params": {"temperature": 0.0, "max_tokens": 3000,
                                                                                     "ignore_eos": True}})
    g.output("text", g.add("llm_decode", inputs={"state": p.out()}).out("text"))

    async def start_then_cancel():
        task = asyncio.create_task(runtime.execute(g, {"question": "1, 2, 3"}))
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        return await runtime.engines("llm").stats()

    stats = call(start_then_cancel())
    assert all(s["open_streams"] == 0 for s in stats)
    # the engine is free: a short request is served right away
    t0 = time.time()
    call(runtime.engines("llm").call("generate", "Hi", {"max_tokens": 2}))
    assert time.time() - t0 < 10


def test_timeline_exports_chrome_trace_and_png(runtime, tmp_path):
    ids = runtime.timeline.query_ids()[-3:]
    trace = runtime.timeline.to_chrome_trace(tmp_path / "trace.json", ids)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert events == trace["traceEvents"]
    assert any(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    png = runtime.timeline.to_png(tmp_path / "gantt.png", ids)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_killed_engine_actor_restarts_and_in_flight_reads_are_retried(runtime, call):
    import ray

    g = PGraph("embed_only")
    q = g.input("question", T.TEXT)
    qs = g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"})
    g.output("vectors", g.add("embed", inputs={"texts": qs.out()}).out())
    texts = [f"question number {i} about the Super Bowl" for i in range(12)]
    actor = runtime.engines("embedder").handles[0].actor

    async def kill_mid_run():
        tasks = [asyncio.create_task(runtime.execute(g, {"question": t}, timeout_s=180)) for t in texts]
        await asyncio.sleep(0.05)
        ray.kill(actor, no_restart=False)  # Ray restarts it (max_restarts); the server reloads its model
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = call(kill_mid_run(), timeout=300)
    failed = [r for r in results if isinstance(r, BaseException)]
    # Every query either completed (retried on the restarted actor) or failed with Ray's clear actor error.
    assert all("actor" in type(r).__name__.lower() or "actor" in str(r).lower() for r in failed), failed
    assert len(failed) <= len(texts) // 2, failed
    after = call(runtime.execute(g, {"question": "a later question"}, timeout_s=180))
    assert len(after["vectors"]) == 1 and after["vectors"][0].shape == (384,)
    # the requests travel over the restarted actor's own direct channel again
    assert runtime.engines("embedder").handles[0].transport == ("channel" if engine_channel.supported() else "ray")


def test_dynamic_expansion_runs_a_sub_graph_sized_by_the_data(runtime, call):
    from teola_plugin.ir.expansion import Expansion

    def per_hit_chain(hits):
        """Data-dependent shape (like refine over N chunks): one embed per retrieved hit."""
        sub = PGraph("per_hit")
        refs = []
        for i, hit in enumerate(hits):
            text = sub.input(f"t{i}", T.TEXT)
            batch = sub.add("aggregate", inputs={"in0": text}, attrs={"mode": "list"})
            refs.append(sub.add("embed", name=f"embed_hit{i}", inputs={"texts": batch.out()}).out())
        sub.output("out", sub.add("aggregate", inputs={f"in{i}": r for i, r in enumerate(refs)},
                                  attrs={"mode": "concat"}).out())
        return Expansion(sub, {f"t{i}": h.text for i, h in enumerate(hits)})

    g = PGraph("expand")
    q = g.input("question", T.TEXT)
    qs = g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"})
    s = g.add("search", inputs={"queries": qs.out()}, attrs={"top_k": 4})
    first = g.add("aggregate", inputs={"in0": s.out()}, attrs={"mode": "pick", "index": 0})
    g.output("vectors", g.add("opaque", name="per_hit", inputs={"hits": first.out()},
                              attrs={"fn": per_hit_chain}).out())
    g.output("hits", first.out())
    qid = f"expand-{uuid.uuid4().hex[:6]}"
    out = call(runtime.execute(g, {"question": "Who founded the Yuan dynasty?"}, query_id=qid, timeout_s=120))
    assert len(out["hits"]) == 4 and len(out["vectors"]) == 4
    expected = call(runtime.engines("embedder").call("embed", [h.text for h in out["hits"]]))
    for got, want in zip(out["vectors"], expected):
        assert abs(float(got @ want) - 1.0) < 1e-4
    spans = [s.node for s in runtime.timeline.spans([qid])]
    assert sorted(n for n in spans if n.startswith("embed_hit")) == [f"embed_hit{i}" for i in range(4)]


def test_tokens_of_the_answer_stream_as_they_are_decoded(runtime, call):
    graph = small_answers(optimize(app_graphs.search_augmented(top_k=2)), max_tokens=24)
    decode = next(p.name for p in graph.nodes if p.op.value == "llm_decode")
    deltas: list[tuple[float, str]] = []
    out = call(runtime.execute(graph, {"question": "Who founded the Yuan dynasty?"}, timeout_s=120,
                               on_token=lambda text: deltas.append((time.time(), text)),
                               token_nodes=frozenset({decode})))
    assert "".join(t for _, t in deltas) == out["answer"]
    assert len(deltas) > 3
    assert deltas[-1][0] - deltas[0][0] > 0.05  # spread over the decode, not one final chunk


def test_engines_started_in_the_background_serve_the_first_query_without_a_start():
    from teola_plugin.runtime.runtime import Runtime, default_engine_specs

    specs = default_engine_specs()
    rt = Runtime({"embedder": specs["embedder"]}, hosting="local")
    try:
        started = rt.start_in_background("embedder")
        assert "embedder" not in rt._pools or started.done()  # returned at once, before the model loaded
        started.result(timeout=300)
        assert set(rt._pools) == {"embedder"}
        g = PGraph("embed_only")
        texts = g.input("texts", T.TEXTS)
        g.output("vectors", g.add("embed", engine="embedder", inputs={"texts": texts}).out())
        pool = rt._pools["embedder"]
        out = rt.run_sync(rt.execute(g, {"texts": ["a first query"]}))
        assert len(out["vectors"]) == 1 and rt._pools["embedder"] is pool  # served by the engine started before
        failing = rt.start_in_background("no-such-engine")
        with pytest.raises(Exception, match="unknown engine"):
            failing.result(timeout=60)
    finally:
        rt.shutdown()


def test_an_engine_whose_actors_are_starting_is_served_by_an_in_process_stand_in(monkeypatch):
    """The first query does not wait for Ray and an actor: the embedder's stand-in (the same
    spec in this process) answers it; once the actors are up they serve, with the same
    vectors, and the stand-in closes. Ray's start is held back here until the first answer."""
    import os
    import threading

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.runtime.runtime import Runtime, default_engine_specs

    ray_may_start = threading.Event()
    init_ray = Runtime._init_ray
    monkeypatch.setattr(Runtime, "_init_ray", lambda self: (ray_may_start.wait(300), init_ray(self))[1])
    rt = Runtime({"embedder": default_engine_specs()["embedder"]})  # Ray-hosted
    g = PGraph("embed_only")
    g.output("vectors", g.add("embed", engine="embedder", inputs={"texts": g.input("texts", T.TEXTS)}).out())
    texts = ["Who won Super Bowl 50?", "Where is the Amazon rainforest?"]
    try:
        first = rt.run_sync(rt.execute(g, {"texts": texts}), timeout=60)["vectors"]  # Ray is held back
        stand_in = rt.engines("embedder")
        assert "embedder" not in rt._pools and stand_in.local_engine() is not None  # served in this process
        library = SentenceTransformer(str(default_model_path()), device="cpu").encode(texts, normalize_embeddings=True)
        assert np.allclose(np.asarray(first), library, atol=1e-5)

        ray_may_start.set()
        rt.run_sync(rt.start_engines("embedder"), timeout=300)  # the start begun behind the stand-in
        second = rt.run_sync(rt.execute(g, {"texts": texts}), timeout=300)["vectors"]
        pool = rt.engines("embedder")
        assert pool is rt._pools["embedder"] and rt.run_sync(pool.stats())[0]["pid"] != os.getpid()
        assert np.allclose(np.asarray(second), np.asarray(first), atol=1e-5)
        deadline = time.time() + 30
        while stand_in.local_engine().started and time.time() < deadline:
            time.sleep(0.1)
        assert not stand_in.local_engine().started and "embedder" not in rt._stand_ins
    finally:
        ray_may_start.set()
        rt.shutdown()


def test_async_callers_start_the_runtime_off_their_event_loop(monkeypatch):
    """The first ``run_async`` / async stream of a fresh runtime starts it (Ray, for a Ray
    runtime: seconds) on a thread, never on the caller's event loop; a shut-down runtime
    then fails clearly instead of waiting on its stopped loop."""
    from teola_plugin.runtime.bridge import iterate_async
    from teola_plugin.runtime.runtime import Runtime

    starts_on_a_loop = []
    ensure_loop = Runtime._ensure_loop

    def spy(self):
        try:
            asyncio.get_running_loop()
            starts_on_a_loop.append(True)
        except RuntimeError:
            starts_on_a_loop.append(False)
        return ensure_loop(self)

    monkeypatch.setattr(Runtime, "_ensure_loop", spy)

    async def numbers():
        for i in range(3):
            yield i

    async def main(rt: Runtime) -> tuple:
        return await rt.run_async(asyncio.sleep(0, "ran")), [i async for i in iterate_async(rt, numbers)]

    for first in ("run_async", "stream"):
        rt = Runtime({}, hosting="local")
        if first == "stream":
            assert asyncio.run(main(rt))[1] == [0, 1, 2]
        assert asyncio.run(main(rt)) == ("ran", [0, 1, 2])
        rt.shutdown()
        never_run = asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="shut down"):
            asyncio.run(rt.run_async(never_run))
        never_run.close()
    assert starts_on_a_loop and not any(starts_on_a_loop)


def test_the_runtime_embedder_runs_passes_of_the_profiles_best_size(runtime, call):
    from teola_plugin.optimizer import CostModel

    best = CostModel.default().best_batch("embedder", "embed_pass")
    assert call(runtime.engines("embedder").call("describe"))["batch_size"] == best  # inside its Ray actor
    assert runtime.specs["embedder"].kwargs["batch_size"] == best


def test_the_engine_processes_compute_at_the_apps_priority(runtime):
    """Ray's raylet starts its workers at nice 15: engines there would yield their cores to
    any other process on the host (the app's own model server, the driver's framework code).
    The embedded runtime starts them at the driver's priority: every process under it, the
    engine actors and vLLM's engine-core processes included, has the driver's niceness."""
    import psutil

    me = psutil.Process()
    niceness = {}
    for p in me.children(recursive=True):
        try:
            niceness[p.pid] = (p.name(), p.nice())
        except psutil.NoSuchProcess:
            continue
    engines = [name for name, _ in niceness.values() if name.startswith(("ray::", "VLLM"))]
    assert len(engines) >= 3, niceness  # the engine actors (vLLM, embedder, ...) and vLLM's own
    assert {n for _, n in niceness.values()} == {me.nice()}, niceness
