"""The end-to-end benchmark: a tiny run on the real engines (one app, one question, two
systems, the bound, no load sweep), its results.json schema and its generated page; plus
the pure pieces (answer scoring, the bound's critical path, the Poisson summary)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from teola_plugin.bench import metrics
from teola_plugin.bench.bound import IsolatingHandlers, RunRecord, batched_work_s, query_bound, trace_bound
from teola_plugin.bench.load import poisson_summary
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.optimizer.cost import CostModel
from teola_plugin.sim.trace import GraphTrace, NodeTrace, QueryTrace


def test_exact_match_and_f1_follow_the_squad_rules():
    assert metrics.exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert metrics.exact_match("Eiffel", ["eiffel tower"]) == 0.0
    assert metrics.f1("Eiffel", ["eiffel tower"]) == pytest.approx(2 / 3)
    assert metrics.f1("nothing alike", ["eiffel tower", "paris"]) == 0.0


def test_latency_stats_of_nothing_say_so():
    assert metrics.latency_stats([]) == {"mean_s": None, "p50_s": None, "p99_s": None, "n": 0}
    assert metrics.latency_stats([1.0, 3.0])["mean_s"] == 2.0


def _diamond() -> PGraph:
    g = PGraph("diamond")
    texts = g.input("texts", T.TEXTS)
    a = g.add("embed", inputs={"texts": texts}, name="a")
    b = g.add("embed", inputs={"texts": texts}, name="b")
    g.output("out", g.add("aggregate", inputs={"in0": a.out(), "in1": b.out()}, attrs={"mode": "concat"},
                          name="c").out())
    return g


def test_bound_is_the_critical_path_of_measured_durations_plus_time_outside_graphs():
    handlers = IsolatingHandlers()
    graph = _diamond()
    handlers.runs[id(graph)] = RunRecord(graph, started=0.0, ended=6.0, durations={"a": 2.0, "b": 3.0, "c": 1.0})
    bound = query_bound(handlers, wall_s=7.0)  # serial run: 6 s in the graph, 1 s outside it
    assert bound["critical_path_s"] == pytest.approx(4.0)  # b then c; a overlaps b
    assert bound["outside_graph_s"] == pytest.approx(1.0)
    assert bound["bound_s"] == pytest.approx(5.0)


def test_an_expanded_node_costs_its_sub_graphs_critical_path():
    handlers = IsolatingHandlers()
    parent, child = _diamond(), _diamond()
    handlers.runs[id(parent)] = RunRecord(parent, 0.0, 1.0, {"a": 0.1, "b": 0.5, "c": 0.1}, {"a": child})
    handlers.runs[id(child)] = RunRecord(child, 1.0, 4.0, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert query_bound(handlers, wall_s=4.0)["critical_path_s"] == pytest.approx(0.1 + 2.0 + 0.1)


def test_a_graph_run_within_another_counts_once():
    """A LangGraph graph runs as one opaque step whose node starts a chain's own graph run: the
    step's isolated duration holds that run, so the run adds nothing to the bound."""
    handlers = IsolatingHandlers()
    outer, called, later = _diamond(), _diamond(), _diamond()
    handlers.runs[id(outer)] = RunRecord(outer, 0.0, 5.0, {"a": 4.0, "b": 0.5, "c": 0.5})  # a: the opaque step
    handlers.runs[id(called)] = RunRecord(called, 1.0, 3.0, {"a": 1.0, "b": 0.5, "c": 0.5})
    handlers.runs[id(later)] = RunRecord(later, 6.0, 8.0, {"a": 1.0, "b": 1.0, "c": 1.0})  # after it: counted
    bound = query_bound(handlers, wall_s=9.0)
    assert bound["critical_path_s"] == pytest.approx(4.5 + 2.0)
    assert bound["outside_graph_s"] == pytest.approx(9.0 - 5.0 - 2.0)
    # two runs of the same span (siblings started together): one of them counts
    twin = _diamond()
    handlers.runs[id(twin)] = RunRecord(twin, 6.0, 8.0, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert query_bound(handlers, wall_s=9.0)["critical_path_s"] == pytest.approx(4.5 + 2.0)


def test_hardware_aware_bound_waits_for_the_busiest_compute_group():
    # Per-item-linear profiles: batching saves nothing, so each duration is its group's work.
    cost = CostModel({"embedder": {"embed": {"batch": [1, 10], "latency_s": [1.0, 10.0]}}}).with_compute_groups(
        {"embedder": "cpu:host", "cpu": "cpu:host"})
    handlers = IsolatingHandlers()
    graph = _diamond()
    handlers.runs[id(graph)] = RunRecord(graph, started=0.0, ended=6.0, durations={"a": 2.0, "b": 3.0, "c": 1.0})
    bound = query_bound(handlers, wall_s=7.0, cost_model=cost)
    assert bound["bound_s"] == pytest.approx(5.0)  # a overlaps b on unlimited engines...
    assert bound["group_work_s"] == {"cpu:host": pytest.approx(6.0)}
    assert bound["hw_bound_s"] == pytest.approx(1.0 + 6.0)  # ...but one CPU computes a, b and c in turn
    # Each engine on hardware of its own: the one embedder still computes a and b in turn,
    # and c, which reads both, runs after the later of them.
    apart = query_bound(handlers, wall_s=7.0, cost_model=CostModel(
        {"embedder": {"embed": {"batch": [1, 10], "latency_s": [1.0, 10.0]}}}))
    assert apart["group_work_s"] == {"engine:embedder": pytest.approx(5.0), "engine:cpu": pytest.approx(1.0)}
    assert apart["hw_bound_s"] == pytest.approx(1.0 + 5.0 + 1.0)
    assert "hw_bound_s" not in query_bound(handlers, wall_s=7.0)  # no cost model: the critical-path bound only


def test_batched_work_counts_a_call_at_its_engines_best_throughput():
    cost = CostModel.default()  # embed: 1 text 0.060 s, 32 texts 0.0914 s (the best per text)
    g = PGraph("g")
    texts = g.input("texts", T.TEXTS)
    one = g.add("embed", inputs={"texts": texts}, attrs={"est_items": 1}, name="one")
    many = g.add("embed", inputs={"texts": texts}, attrs={"est_items": 32}, name="many")
    assert batched_work_s(cost, one, 0.06) == pytest.approx(0.06 * (0.0914 / 32) / 0.060)
    assert batched_work_s(cost, many, 0.0914) == pytest.approx(0.0914)  # already the best batch
    prefill = g.add("llm_prefill", inputs={"prompt": g.input("prompt", T.PROMPT)}, attrs={"est_prompt_tokens": 16})
    decode = g.add("llm_decode", inputs={"state": prefill.out("state")}, attrs={"max_tokens": 8})
    assert batched_work_s(cost, prefill, 0.0189) == pytest.approx(0.0189 * (1.148 / 2048) / (0.0189 / 16))
    assert batched_work_s(cost, decode, 0.5) == 0.0  # decode batches across sequences: left to the critical path


def _leaves_then_root(prefill_s: float = 1.0, tokens: float = 100.0) -> QueryTrace:
    """tree_summarize's shape: three leaf prefills (``tokens`` prompt tokens) each followed by
    its decode (2 s), then the root's prefill and decode, all on the one LLM engine."""
    def node(name, op, preds, measured):
        return NodeTrace(name, op, "llm", "llm", "engine:llm", preds, tokens, measured)
    leaves = [n for i in range(3) for n in (node(f"p{i}", "llm_prefill", (), prefill_s),
                                            node(f"d{i}", "llm_decode", (f"p{i}",), 2.0))]
    root = (node("p_root", "llm_prefill", ("d0", "d1", "d2"), 0.5), node("d_root", "llm_decode", ("p_root",), 1.0))
    return QueryTrace("summarize", "q", (GraphTrace("g", (*leaves, *root)),), 0.0)


def test_hardware_aware_bound_waits_for_a_levels_prefills_on_the_one_engine_before_its_last_decode():
    # 100 prompt tokens take 1 s at the engine's best rate (0.01 s a token), batched or not
    cost = CostModel({"llm": {"llm_prefill": {"batch": [100, 200], "latency_s": [1.0, 2.0]}}})
    bound = trace_bound(_leaves_then_root(), cost)
    assert bound["critical_path_s"] == pytest.approx(1.0 + 2.0 + 0.5 + 1.0)  # the leaves side by side
    # the root cannot start before the engine prefilled all three leaves (3 s) and then
    # decoded the last of them (2 s)
    assert bound["hw_bound_s"] == pytest.approx(3 * 1.0 + 2.0 + 0.5 + 1.0)
    assert bound["group_work_s"] == {"engine:llm": pytest.approx(3 * 1.0 + 0.5)}  # decode: only on the paths
    # a prefill timed at 1.5 s (vLLM ran other streams on meanwhile) is 1 s of the engine's work
    slow = trace_bound(_leaves_then_root(prefill_s=1.5), cost)
    assert slow["critical_path_s"] == pytest.approx(1.5 + 2.0 + 0.5 + 1.0)
    assert slow["hw_bound_s"] == pytest.approx(3 * 1.0 + 2.0 + 0.5 + 1.0)


def test_rebound_recomputes_a_finished_runs_bounds_from_its_traces_and_says_so():
    from teola_plugin.bench.rebound import rebound
    from teola_plugin.bench.report import render

    trace = _leaves_then_root(tokens=2048.0)  # the default profile's best prefill: 2048 tokens in 1.148 s
    results = {"command": "teola bench", "mode": "full", "machine": "m", "apps": {"summarize": {
        "title": "Summarize", "framework": "llama_index", "workload": "w",
        "systems": {"plain-sequential": {"mean_s": 13.0}, "teola-full": {"mean_s": 6.5}},
        "bounds": [{"query": "q", "bound_s": 4.5, "hw_bound_s": 4.5}, {"query": "lost", "error": "Boom"}]}}}
    assert rebound(results, {"summarize": [trace.to_dict()], "other": []}) == ["summarize"]
    app = results["apps"]["summarize"]
    assert app["hw_bound_mean_s"] == pytest.approx(6.5) and app["teola_over_hw_bound"] == pytest.approx(1.0)
    assert app["bound_mean_s"] == pytest.approx(4.5) and app["ideal_speedup"] == pytest.approx(13.0 / 4.5, abs=1e-3)
    assert app["bounds"][1] == {"query": "lost", "error": "Boom"}  # a failed bound run stays as it was
    assert results["bounds_recomputed"]["apps"] == ["summarize"]
    assert "bounds recomputed from the run's recorded traces" in render({**results, "apps": {}}, {})  # the header
    untouched = {"apps": {"x": {"bounds": []}}}
    assert rebound(untouched, {}) == [] and "bounds_recomputed" not in untouched
    # a measured bound without its trace: the app keeps the bounds it had
    partial = {"apps": {"summarize": {"systems": {}, "bound_mean_s": 4.5,
                                      "bounds": [{"query": "q", "bound_s": 4.5}, {"query": "other", "bound_s": 9.0}]}}}
    assert rebound(partial, {"summarize": [trace.to_dict()]}) == [] and "bounds_recomputed" not in partial
    assert partial["apps"]["summarize"]["bound_mean_s"] == 4.5


def test_poisson_summary_finds_where_plain_concurrent_saturates():
    row = lambda system, rate, thr, p99, good: {"system": system, "rate_qps": rate, "throughput_qps": thr,  # noqa: E731
                                                "p99_s": p99, "mean_s": p99, "n": 5, "goodput_qps": good}
    rows = [row("plain-concurrent", 0.5, 0.5, 4.0, 0.5), row("teola-full", 0.5, 0.5, 3.0, 0.5),
            row("plain-concurrent", 1.0, 0.6, 20.0, 0.2), row("teola-full", 1.0, 0.95, 5.0, 0.9)]
    summary = poisson_summary(rows)
    assert summary["saturation_rate_qps"] == 1.0 and summary["saturated"]
    assert summary["p99_ratio"] == pytest.approx(4.0)
    assert summary["goodput_ratio"] == pytest.approx(4.5)  # teola's 0.9 q/s within the SLO over plain's 0.2
    # plain's goodput peaked below its saturating rate; teola's at the highest rate run, so maybe higher
    assert summary["goodput_peaks"] == {"plain-concurrent": {"rate_qps": 0.5, "goodput_qps": 0.5, "at_highest_rate": False},
                                        "teola-full": {"rate_qps": 1.0, "goodput_qps": 0.9, "at_highest_rate": True}}
    # latency alone also marks saturation: mean 4 s at 0.5 q/s is over twice an unloaded 1.5 s
    assert poisson_summary(rows, unloaded_s=1.5)["saturation_rate_qps"] == 0.5
    assert poisson_summary(rows, unloaded_s=1.5)["goodput_ratio"] == pytest.approx(1.0)
    assert poisson_summary(rows, unloaded_s=3.0)["saturation_rate_qps"] == 1.0
    # no answer of plain's within the SLO: no ratio (rather than a division by zero)
    rows[2]["goodput_qps"] = 0.0
    assert "goodput_ratio" not in poisson_summary(rows)
    rows[2]["goodput_qps"], rows[3]["goodput_qps"] = 0.2, 0.0  # none of teola's: a ratio of 0
    assert poisson_summary(rows)["goodput_ratio"] == 0.0


@pytest.mark.slow
@pytest.mark.extended  # one app under two systems, bound and page (~3.5 min on 2 slow cores): `make test-all`
def test_tiny_benchmark_end_to_end_writes_results_and_page(runtime, tmp_path):
    from teola_plugin.bench import report
    from teola_plugin.bench.runner import Bench, BenchConfig

    config = BenchConfig(apps=["search_gen"], questions=1, systems=["plain-sequential", "teola-full"],
                         poisson_apps=[], max_tokens=16, mode="test", command="pytest tests/test_bench.py")
    saved = runtime.handlers
    runtime.handlers = IsolatingHandlers()  # the bound needs the measuring handlers
    try:
        results = Bench(config, runtime=runtime).run()
    finally:
        runtime.handlers = saved
    written = report.generate(results, tmp_path / "benchmarks", tmp_path / "benchmarks.md")

    data = json.loads(written["results"].read_text())
    assert data["machine"] and data["mode"] == "test"
    app = data["apps"]["search_gen"]
    assert app["errors"] == []
    for system in ("plain-sequential", "teola-full"):
        stats = app["systems"][system]
        assert set(stats) >= {"mean_s", "p50_s", "p99_s", "n", "fidelity", "em", "f1"}
        assert stats["n"] == 1 and stats["mean_s"] > 0
        assert 0.0 <= stats["fidelity"] <= 1.0
    assert app["systems"]["plain-sequential"]["fidelity"] == 1.0  # the reference agrees with itself
    assert app["bound_mean_s"] > 0 and app["bounds"][0]["critical_path_s"] > 0
    # one CPU computes every engine's work in turn: never below the critical-path bound
    assert app["hw_bound_mean_s"] >= app["bound_mean_s"] and app["bounds"][0]["group_work_s"]
    assert "hardware-aware bound" in written["page"].read_text()
    assert 0.0 <= app["plain_outside_llm_share"] <= 1.0
    assert [r["answer"] for r in app["runs"] if r["system"] == "teola-full"][0]  # a real answer came back
    page = written["page"].read_text()
    assert "pytest tests/test_bench.py" in page and "| teola-full | 1 |" in page
    for name in ("cdf", "speedup", "gantt_search_gen"):
        assert written[name].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.extended  # two questions under two systems on the real engines (~3.5 min on 2 slow cores): `make test-all`
def test_an_interrupted_benchmark_resumes_where_it_stopped(runtime, tmp_path, monkeypatch):
    """Ctrl-C in the middle of the second question (one system done): only the first
    question is on disk; the resumed run redoes the second whole and reports both questions
    under every system, once each."""
    from teola_plugin.bench import report
    from teola_plugin.bench.checkpoint import Checkpoint
    from teola_plugin.bench.runner import Bench, BenchConfig

    config = BenchConfig(apps=["search_gen"], questions=2, systems=["plain-sequential", "teola-full"],
                         poisson_apps=[], bound=False, max_tokens=8, mode="test", command="pytest resume")
    path = tmp_path / "checkpoint.json"
    calls: list[str] = []  # query ids: the warm-up question twice, q1 twice, then q2
    real_run_one = Bench.run_one

    def run_one(self, app, query, system, record_events=False):
        if len(set(calls)) == 3 and calls.count(query.id) == 1:  # q2's second system: interrupt
            raise KeyboardInterrupt
        calls.append(query.id)
        return real_run_one(self, app, query, system, record_events)

    monkeypatch.setattr(Bench, "run_one", run_one)
    with pytest.raises(KeyboardInterrupt):
        Bench(config, runtime=runtime, checkpoint=Checkpoint.start(path, dict(vars(config)))).run()
    saved = json.loads(path.read_text())
    q1, q2 = calls[2], calls[4]
    assert saved["current"]["questions_done"] == 1
    assert [r["query"] for r in saved["current"]["runs"]] == [q1, q1]  # q2's finished run is not kept alone
    assert len(saved["segments"]) == 1 and saved["segments"][0]["ended"] and not saved["segments"][0]["open"]

    monkeypatch.setattr(Bench, "run_one", real_run_one)
    resumed = Checkpoint.resume(path)
    results = Bench(BenchConfig(**resumed.config), runtime=runtime, checkpoint=resumed).run()
    app = results["apps"]["search_gen"]
    assert sorted((r["query"], r["system"]) for r in app["runs"]) == sorted(
        (q, s) for q in (q1, q2) for s in ("plain-sequential", "teola-full"))
    assert [r for r in app["runs"] if r["query"] == q1] == [
        {k: v for k, v in r.items() if k not in ("events", "spans")} for r in saved["current"]["runs"]]
    assert app["gantt"]["teola_spans"]
    assert [r["spans"] for r in saved["current"]["runs"] if r["system"] == "teola-full"][0]  # kept on disk
    assert len(results["segments"]) == 2 and results["command"] == "pytest resume"
    assert not json.loads(path.read_text())["finished"]  # not before its results are written
    written = report.generate(results, tmp_path / "benchmarks", tmp_path / "benchmarks.md")
    assert "ran in 2 segments" in written["page"].read_text()
    resumed.finish()
    assert json.loads(path.read_text())["finished"]


def test_a_killed_segment_is_closed_at_its_last_save_when_the_run_resumes(tmp_path):
    import subprocess
    import sys

    from teola_plugin.bench.checkpoint import Checkpoint

    path = tmp_path / "checkpoint.json"
    ckpt = Checkpoint.start(path, {"apps": []})
    ckpt.begin_segment("test machine")
    ckpt.save()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    data = json.loads(path.read_text())
    data["segments"][0]["pid"] = int(gone.stdout)  # a process killed outright: its segment still open
    path.write_text(json.dumps(data))
    (seg,) = Checkpoint.resume(path).data["segments"]
    assert seg["killed"] and not seg["open"] and seg["ended"] and seg["machine"] == "test machine"


@pytest.mark.slow
@pytest.mark.extended  # a benchmark app's streaming run (`teola bench` runs it too): `make test-all`
def test_llama_index_apps_stream_the_same_answer_and_report_the_first_token(runtime):
    """Under load the LlamaIndex apps stream (``streaming=True`` + ``aquery``), plain and on
    Teola: the streamed text is the answer, with the same sources, and the time to its first
    token is measured from the query's arrival (indexing included)."""
    import asyncio

    from llama_index.core import Settings

    from teola_plugin.bench.apps.base import PLAIN_CONCURRENT, TEOLA_FULL
    from teola_plugin.bench.apps.llama_apps import NaiveDocQA

    app = NaiveDocQA(runtime, max_tokens=12)
    app.n_docs = 12  # a small upload: the streaming path, not the indexing, is under test
    (query,) = app.queries(1)
    saved = Settings._llm, Settings._embed_model  # the private slots: the getters resolve defaults
    try:
        app.setup([query])
        for system in (PLAIN_CONCURRENT, TEOLA_FULL):
            whole = asyncio.run(app.arun(query, system))
            streamed = asyncio.run(app.arun(query, system, stream=True))
            assert streamed.text == whole.text and streamed.text
            assert streamed.sources == whole.sources and len(whole.sources) == 3
            assert streamed.ttft_s is not None and whole.ttft_s is None
    finally:
        Settings.executor = None
        Settings._llm, Settings._embed_model = saved


def test_a_decodes_token_count_is_the_engines_running_count_not_its_deltas():
    """vLLM's deltas can hold several tokens; each carries the request's running count."""
    import asyncio

    from teola_plugin.bench.bound import _TokenCounter
    from teola_plugin.engines.generation import GenerationDelta

    class Ctx:
        async def resume_stream(self, sid):
            for n in (5, 9, 12):  # three deltas, twelve tokens
                yield GenerationDelta(sid, "x", n, n == 12)

    state = SimpleNamespace(first=[GenerationDelta("r", "a", 2, False)])
    counter = _TokenCounter(Ctx(), state)
    assert counter.tokens == 2

    async def read():
        return [d.text async for d in counter.resume_stream("r")]
    assert asyncio.run(read()) == ["x", "x", "x"] and counter.tokens == 12


def test_a_decode_whose_tokens_came_while_others_were_timed_counts_them_in_the_bound():
    from teola_plugin.bench.bound import trace_bound
    from teola_plugin.sim.trace import GraphTrace, NodeTrace, QueryTrace

    def decode(name, preds, measured, tokens):
        return NodeTrace(name, "llm_decode", "llm", "llm", "g", preds, 32.0, measured, None, tokens)
    whole = decode("d1", (), 0.64, 16)  # 40 ms a token, timed whole
    short = decode("d2", ("d1",), 0.01, 30)  # made while d1 was timed
    bound = trace_bound(QueryTrace("app", "q", (GraphTrace("g", (whole, short)),), 0.5))
    assert bound["critical_path_s"] == pytest.approx(0.64 + 29 * 0.04)
    assert bound["bound_s"] == pytest.approx(0.5 + 0.64 + 29 * 0.04)


@pytest.mark.slow
@pytest.mark.extended  # two benchmark apps end to end (`teola bench --apps li_workflow lg_multihop`): `make test-all`
def test_the_fan_out_apps_run_their_framework_composition_with_the_calls_on_teola(runtime):
    """The workflow and LangGraph apps (#18 / #19 benchmark rows): the Workflow's two parallel
    query engines are run by the executor (lowered graphs) and answer from the same sources as
    plain; the LangGraph graph runs as it is, one Send branch per sub-question, every model
    call on the engine. (Greedy answers may differ where concurrent branches share a batch, as
    between two plain runs, so the answers' text is compared in the benchmark's fidelity.)"""
    import asyncio

    from llama_index.core import Settings

    from teola_plugin.bench.apps.base import PLAIN_SEQUENTIAL, TEOLA_FULL
    from teola_plugin.bench.apps.fan_out_apps import MultiHopLangGraph, WorkflowFanOut

    app = WorkflowFanOut(runtime, max_tokens=12)
    app.n_docs = 12
    (query,) = app.queries(1)
    saved = Settings._llm, Settings._embed_model
    try:
        app.setup([query])
        plain = asyncio.run(app.arun(query, PLAIN_SEQUENTIAL))
        teola = asyncio.run(app.arun(query, TEOLA_FULL))
        executor = app._executors[TEOLA_FULL.name]
        assert executor.last_query_id is not None  # the steps' aquery calls ran through it
        assert teola.sources == plain.sources and len(plain.sources) == 6 and teola.text
    finally:
        Settings.executor = None
        Settings._llm, Settings._embed_model = saved

    graph_app = MultiHopLangGraph(runtime, max_tokens=12)
    (question,) = graph_app.queries(1)
    graph_app.setup([question])
    wrapped = graph_app.runnable(TEOLA_FULL)
    assert [n.component for n in wrapped._plan(graph_app.chain_input(question)).trace.opaque] == ["LangGraph"]
    state = wrapped.invoke(graph_app.chain_input(question))
    assert state["answer"].strip() and 1 <= len(state["findings"]) <= 3
    assert len(state["findings"]) == max(1, len(state["subs"]))


@pytest.mark.slow
@pytest.mark.extended  # two benchmark apps end to end (`teola bench --apps li_sub_question li_chat`): `make test-all`
def test_the_multi_step_apps_run_lowered_with_plains_sub_questions_sources_and_memory(runtime):
    """The sub-question and chat apps (#18 benchmark rows), on the in-process engine: the
    question generator's JSON is valid by construction (structured outputs through
    ``TeolaLLM(sampling_kwargs=...)``), so plain and Teola ask the same two sub-questions of
    their tools and answer from the same passages, with nothing opaque under Teola; the
    two-turn chat ends with the same memory and turn two's sources. Each run starts with the
    engine's prefix cache emptied, as the benchmark's do (a prompt read partly from the cache
    can round differently on a CPU)."""
    from llama_index.core import Settings

    from teola_plugin.bench.apps.base import PLAIN_SEQUENTIAL, TEOLA_FULL
    from teola_plugin.bench.apps.multi_step_apps import FOLLOW_UP, ChatDocQA, SubQuestionDocQA

    def cold() -> None:
        runtime.run_sync(runtime.engines("llm").call("reset_prefix_cache"), timeout=60)

    saved = Settings._llm, Settings._embed_model
    try:
        app = SubQuestionDocQA(runtime, max_tokens=12)
        app.n_docs = 12
        (query,) = app.queries(1)
        app.setup([query])
        app.use(PLAIN_SEQUENTIAL)
        engine = app.query_engine(query.data["docs"], use_async=False)
        cold()
        plain = engine.query(query.question)
        app.use(TEOLA_FULL)
        executor = app._executors[TEOLA_FULL.name]
        assert executor.traced(engine).opaque == []
        cold()
        teola = executor.query(engine, query.question)
        asked = [[n.node.get_content().split("\n")[0] for n in r.source_nodes if not n.node.ref_doc_id]
                 for r in (plain, teola)]
        assert asked[0] == asked[1] and len(asked[0]) == 2 and all(q.startswith("Sub question: ") for q in asked[0])
        passages = [[n.node.ref_doc_id for n in r.source_nodes if n.node.ref_doc_id] for r in (plain, teola)]
        assert passages[0] == passages[1] and len(passages[0]) == 4  # top 2 of each sub-question's tool

        chat = ChatDocQA(runtime, max_tokens=12)
        chat.n_docs = 12
        (turns,) = chat.queries(1)
        chat.setup([turns])
        memories, sources = [], []
        for system in (PLAIN_SEQUENTIAL, TEOLA_FULL):
            chat.use(system)
            engine = chat.chat_engine(turns.data["docs"], use_async=False)
            cold()
            engine.chat(turns.question)
            sources.append([n.node.ref_doc_id for n in engine.chat(FOLLOW_UP).source_nodes])
            memories.append([(m.role.value, m.content) for m in engine.chat_history])
        assert memories[0] == memories[1] and len(memories[0]) == 4
        assert sources[0] == sources[1] and len(sources[0]) == 3
        assert chat._executors[TEOLA_FULL.name].last_query_id is not None  # turn two's retrieval ran on Teola
    finally:
        Settings.executor = None
        Settings._llm, Settings._embed_model = saved
