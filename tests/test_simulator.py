"""The scheduler simulation (`teola simulate`) on small graphs whose schedule is known by hand."""

from __future__ import annotations

import json

import pytest

from teola_plugin.capture import app_graphs
from teola_plugin.errors import ConfigError
from teola_plugin.ir.graph import PGraph
from teola_plugin.optimizer import CostModel, PassManager
from teola_plugin.runtime.policies import BatchPolicy
from teola_plugin.sim.durations import Durations
from teola_plugin.sim.simulator import SYSTEMS, SystemModel, simulate
from teola_plugin.sim.trace import GraphTrace, NodeTrace, QueryTrace, graph_trace

PROFILE = CostModel({
    "embedder": {"embed": {"batch": [1, 2], "latency_s": [1.0, 1.2]}},
    "reranker": {"rerank": {"batch": [1], "latency_s": [1.0]}},
    # one step: 0.1 s for one sequence, 0.12 s for two in flight
    "llm": {"llm_decode": {"batch": [64], "latency_s": [6.4]},
            "llm_decode_concurrent": {"batch": [64, 128], "latency_s": [6.4, 7.68]},
            "llm_prefill": {"batch": [10, 20], "latency_s": [1.0, 1.5]}},
})
MEASURED = Durations("measured", PROFILE)


def node(name, op="embed", engine="embedder", kind="embedder", group="g1", preds=(), items=1.0, measured=1.0,
         expansion=None):
    return NodeTrace(name, op, engine, kind, group, tuple(preds), items, measured, expansion)


def query(*nodes, name="q", outside=0.0):
    return QueryTrace("app", name, (GraphTrace("g", tuple(nodes)),), outside)


def latencies(traces, system, arrivals=None, durations=MEASURED, **kw):
    return [round(r.latency_s, 6) for r in simulate(traces, durations, SYSTEMS[system], arrivals, **kw)]


def test_independent_work_on_two_groups_overlaps_under_teola_only():
    q = query(node("a"), node("b", op="rerank", engine="reranker", kind="reranker", group="g2"),
              node("join", op="aggregate", engine="cpu", kind="cpu", group="g3", preds=("a", "b"), measured=0.0))
    assert latencies([q], "teola-full") == [1.0]
    assert latencies([q], "plain-sequential") == [2.0]


def test_work_on_one_group_shares_it():
    """Overlap on shared hardware saves nothing: each runs at half speed."""
    q = query(node("a"), node("b", op="rerank", engine="reranker", kind="reranker", group="g1"))
    assert latencies([q], "teola-full") == [2.0]


def test_cpu_cores_shared_by_two_activities_get_the_measured_share_of_their_work_done():
    """On a CPU group two activities together get ``cpu_sharing`` of one alone's work done
    (thread pools on the same cores cost each other); alone, an activity runs at full speed,
    and a group that is not a CPU's keeps the equal, loss-free split."""
    lossy = Durations("measured", PROFILE, cpu_sharing=0.8)
    on_cpu = query(node("a", group="cpu:host"), node("b", op="rerank", engine="reranker", kind="reranker",
                                                      group="cpu:host", measured=0.5))
    # both at 0.4x until b's 0.5 s of work is done (1.25 s), then a's last 0.5 s alone
    assert latencies([on_cpu], "teola-full", durations=lossy) == [1.75]
    assert latencies([on_cpu], "teola-full") == [1.5]  # the default: an equal split, no loss
    assert latencies([on_cpu], "plain-sequential", durations=lossy) == [1.5]  # one at a time: nothing shared
    on_gpu = query(node("a", group="gpu:0"), node("b", op="rerank", engine="reranker", kind="reranker",
                                                   group="gpu:0", measured=0.5))
    assert latencies([on_gpu], "teola-full", durations=lossy) == [1.5]
    with pytest.raises(ConfigError, match="cpu_sharing"):
        Durations("measured", PROFILE, cpu_sharing=1.5)


def test_engine_batches_across_queries_at_the_profiles_gain():
    qs = [query(node("a"), name="q1"), query(node("a"), name="q2")]
    # one call of 2 items: 2 x 1.0 s x (1.2 / 2.0)
    assert latencies(qs, "teola-full", arrivals=[0.0, 0.0]) == [1.2, 1.2]
    # no batching (threads calling an in-process model): two calls side by side, each at half speed
    unbatched = SystemModel("threads", overlap=True, batching=False)
    assert [r.latency_s for r in simulate(qs, MEASURED, unbatched, [0.0, 0.0])] == pytest.approx([2.0, 2.0])


def test_decodes_share_steps():
    decode = dict(op="llm_decode", engine="llm", kind="llm")
    qs = [query(node("d", measured=1.0, **decode), name="q1"), query(node("d", measured=1.0, **decode), name="q2")]
    # 10 steps each (1.0 s / 0.1 s), stepping together at 0.12 s a step
    assert latencies(qs, "plain-concurrent", arrivals=[0.0, 0.0]) == [1.2, 1.2]
    assert latencies(qs[:1], "teola-full") == [1.0]


def test_a_prefill_runs_in_the_llm_engines_next_step_and_the_decodes_wait_for_it():
    llm = dict(engine="llm", kind="llm", group="gpu")
    q1 = query(node("d", op="llm_decode", measured=1.0, **llm), name="q1")  # 10 steps of 0.1 s
    q2 = query(node("p", op="llm_prefill", items=10, measured=0.5, **llm), name="q2")
    results = simulate([q1, q2], MEASURED, SYSTEMS["teola-full"], [0.0, 0.2])
    assert [round(r.finish_s, 6) for r in results] == [1.5, 0.7]  # the prefill at full speed, the decode paused


def test_a_prefill_holds_the_decodes_only_for_the_stall_the_profile_measured():
    """The rest of a prefill's recorded time (its way into the engine and back) delays only its
    own query."""
    stalls = CostModel({**PROFILE.to_dict()["profiles"],
                        "llm": {**PROFILE.to_dict()["profiles"]["llm"],
                                "llm_prefill_stall": {"batch": [10, 20], "latency_s": [0.2, 0.4]}}})
    llm = dict(engine="llm", kind="llm", group="gpu")
    q1 = query(node("d", op="llm_decode", measured=1.0, **llm), name="q1")
    q2 = query(node("p", op="llm_prefill", items=10, measured=0.5, **llm), name="q2")
    results = simulate([q1, q2], Durations("measured", stalls), SYSTEMS["teola-full"], [0.0, 0.2])
    # the decode pauses 0.2 s (0.2-0.4), the prefill answers after its 0.5 s
    assert [round(r.finish_s, 6) for r in results] == [1.2, 0.7]


def test_an_expansion_runs_before_its_node_is_done():
    inner = GraphTrace("inner", (node("b", op="opaque", engine="cpu", kind="cpu", group="g2", measured=2.0),))
    q = query(node("a", op="opaque", engine="cpu", kind="cpu", group="g2", expansion=inner),
              node("c", preds=("a",)))
    assert latencies([q], "teola-full") == [4.0]  # 1 s planning, 2 s expanded graph, 1 s embed


def test_closed_loop_starts_each_query_when_the_last_ends():
    qs = [query(node("a"), name="q1", outside=0.5), query(node("a"), name="q2")]
    results = simulate(qs, MEASURED, SYSTEMS["teola-full"])
    assert [(r.arrival_s, r.finish_s) for r in results] == [(0.0, 1.5), (1.5, 2.5)]


def upload_and_question(name):
    """A doc-QA query: a 2 s upload and a 0.5 s question embedding on one embedder, then a join."""
    return query(node("up", measured=2.0), node("q", measured=0.5),
                 node("join", op="aggregate", engine="cpu", kind="cpu", group="g3", preds=("up", "q"), measured=0.0),
                 name=name)


def test_the_engine_serves_each_request_by_its_latest_start():
    """Least laxity first. q0's upload is its critical path (latest start 0 s), its question has
    1.5 s of slack (latest start 1.5 s). Arrivals after 1.5 s queue behind q0's question; the
    old rule (longest remaining path first) ran every later upload before it."""
    one_at_a_time = {"embedder": BatchPolicy(max_batch_size=1)}
    qs = [upload_and_question(f"q{i}") for i in range(3)]
    # q1 and q2 arrive after q0's question was due to start: it runs at 2 s, when the embedder frees
    assert latencies(qs, "teola-full", [0.0, 1.6, 1.8], policies=one_at_a_time) == [2.5, 5.4, 5.7]
    old = SystemModel("old rule", overlap=True, batching=True, priority="remaining_path")
    results = simulate(qs, MEASURED, old, [0.0, 1.6, 1.8], policies=one_at_a_time)
    assert [round(r.latency_s, 6) for r in results] == [6.5, 5.4, 5.7]  # q0 waited for both uploads
    # q1 arrives at 1 s, its upload due to start before q0's question: q0 yields to it, and only to it
    assert latencies(qs, "teola-full", [0.0, 1.0, 1.8], policies=one_at_a_time) == [4.5, 6.0, 5.7]


def test_an_admission_cap_turns_shared_hardware_into_first_come_first_served():
    work = dict(op="opaque", engine="cpu", kind="cpu", group="g1")
    qs = [query(node("a", **work), name="q1"), query(node("a", **work), name="q2")]
    assert latencies(qs, "teola-full", arrivals=[0.0, 0.0]) == [2.0, 2.0]  # side by side, half speed
    capped = SystemModel("capped", overlap=True, batching=True, max_queries=1)
    results = simulate(qs, MEASURED, capped, [0.0, 0.0])
    assert [(r.arrival_s, round(r.finish_s, 6)) for r in results] == [(0.0, 1.0), (0.0, 2.0)]  # q2 waited


def test_transfer_scales_engine_work_to_the_target_hardware_and_keeps_host_steps():
    fast = CostModel({"embedder": {"embed": {"batch": [1, 2], "latency_s": [0.25, 0.3]}}})
    q = query(node("a"), node("c", op="opaque", engine="cpu", kind="cpu", group="g2", preds=("a",), measured=0.5))
    assert latencies([q], "teola-full", durations=Durations("measured", PROFILE, target=fast)) == [0.75]
    with pytest.raises(ConfigError):
        Durations("profile", PROFILE, target=fast)
    with pytest.raises(ConfigError, match="unknown duration mode"):
        Durations("guess", PROFILE)


def test_a_decode_moves_to_other_hardware_by_its_recorded_tokens():
    fast = CostModel({"llm": {"llm_decode_concurrent": {"batch": [64, 128], "latency_s": [1.28, 1.28]}}})
    moved = Durations("measured", PROFILE, target=fast)  # 0.02 s a step there, 0.1 s here
    decode = node("d", op="llm_decode", engine="llm", kind="llm", measured=1.0)
    assert moved.alone(NodeTrace(**{**decode.__dict__, "tokens": 5})) == pytest.approx(5 * 0.02)
    assert moved.alone(decode) == pytest.approx(1.0 * 0.02 / 0.1)  # tokens unknown: by the steps' ratio
    assert MEASURED.alone(decode) == 1.0  # same hardware: as recorded
    assert moved.decode_slowdown(decode, 2) == pytest.approx(1.0)  # the target batches two for free


def test_a_decode_timed_short_costs_at_least_its_tokens_at_the_recorded_step():
    """vLLM runs on a stream while the isolated run times other primitives, so a decode can
    be recorded at almost nothing; the step comes from the decodes timed whole."""
    from teola_plugin.sim.durations import recorded_decode_step

    whole = NodeTrace("d1", "llm_decode", "llm", "llm", "g", (), 32.0, 0.64, None, 16)  # 40 ms a token
    short = NodeTrace("d2", "llm_decode", "llm", "llm", "g", (), 32.0, 0.01, None, 30)  # made while others ran
    step = recorded_decode_step([QueryTrace("app", "q", (GraphTrace("g", (whole, short)),))])
    assert step == pytest.approx(0.04)
    floored = Durations("measured", PROFILE, decode_step_s=step)
    assert floored.alone(short) == pytest.approx(29 * 0.04)  # the first token came with the prefill
    assert floored.alone(whole) == pytest.approx(0.64)


def test_trace_round_trips_through_json():
    inner = GraphTrace("inner", (node("b", measured=None),))
    decode = NodeTrace("d", "llm_decode", "llm", "llm", "g", ("c",), 32.0, 0.5, None, 12)
    q = QueryTrace("app", "q", (GraphTrace("g", (node("a", expansion=inner), node("c", preds=("a",)), decode)),),
                   0.25, {"note": "x"})
    assert QueryTrace.from_dict(json.loads(json.dumps(q.to_dict()))) == q


def test_a_traced_app_graph_simulates_from_the_profile_alone():
    """Profile mode: a graph never run (no timings) is simulated from the cost model; the
    optimizer's overlap shows when engines have their own hardware."""
    g = PGraph("advanced")
    app_graphs.build_advanced_rag(g)
    cost = CostModel.default()
    optimized = PassManager().run(g, cost)
    trace = QueryTrace("advanced_rag", "q", (graph_trace(optimized, cost),))
    assert all(n.measured_s is None for n in trace.graphs[0].nodes)
    durations = Durations("profile", cost)
    teola, plain = latencies([trace], "teola-full", durations=durations), latencies([trace], "plain-sequential",
                                                                                     durations=durations)
    assert 0 < teola[0] < plain[0]
    total = sum(durations.alone(n) for n in trace.graphs[0].all_nodes())
    assert plain[0] == pytest.approx(total)  # one primitive after another: the sum of their times


def test_a_broken_trace_is_reported_not_returned_short():
    q = query(node("a", preds=("missing_in_graph",)), node("b", preds=("b",)))
    with pytest.raises(RuntimeError, match="unfinished"):
        simulate([q], MEASURED, SYSTEMS["teola-full"])


# -- GPU deployments and the calibration on a recorded benchmark run -------------------------------
def test_a_deployment_profile_follows_its_roofline():
    from teola_plugin.sim.hardware import Deployment

    d = Deployment.named("rtx3090", "llama-2-7b")
    # weights read once per step: 13.5 GB at 0.7 x 936 GB/s, plus the step overhead
    assert d.decode_step_s(1) == pytest.approx(0.004 + 2 * 6.74e9 / (936e9 * 0.7))
    assert d.decode_step_s(1) < d.decode_step_s(256)  # compute-bound at last
    assert d.prefill_s(4096) > d.prefill_s(512)
    assert d.compute_groups() == {"llm": "gpu:0", "embedder": "gpu:1", "reranker": "gpu:1"}
    host = Deployment.named("l4", "llama-3-8b", encoders_on_gpu=False)
    assert "embedder" not in host.profile() and host.compute_groups()["embedder"] == "cpu:host"
    assert any("host's CPU" in a for a in host.assumptions())
    with pytest.raises(ConfigError, match="unknown GPU"):
        Deployment.named("tpu", "llama-2-7b")


def test_deployment_names_are_checked():
    from teola_plugin.sim.report import parse_deployment

    assert parse_deployment("a100-40gb:llama-3-8b:host").encoders_on_gpu is False
    for bad in ("a100-40gb", "a100-40gb:llama-3-8b:cpu", "a100-40gb:gpt-5"):
        with pytest.raises(ConfigError):
            parse_deployment(bad)


def test_bench_arrivals_are_the_benchs_own():
    """The Poisson sweep's arrival times, drawn as the benchmark's runner draws them."""
    import random

    from teola_plugin.bench.load import poisson_arrivals

    rng, t, expected = random.Random("0-0.25"), 0.0, []
    for _ in range(5):
        t += rng.expovariate(0.25)
        expected.append(t)
    assert poisson_arrivals(0.25, 5, 0) == expected


def test_the_published_simulation_is_what_the_code_computes_from_its_recorded_run():
    """docs/benchmarks/simulation.json (the page's numbers) recomputed from the recorded
    benchmark run it names: calibration on this machine's profiles, and the predictions."""
    from pathlib import Path

    from teola_plugin.sim import report

    root = Path(__file__).resolve().parents[1]
    published = json.loads((root / "docs/benchmarks/simulation.json").read_text())
    source = published["source"]
    again = report.run(root / source["results"], root / source["profile"],
                       [d["deployment"] for d in published["predictions"].values()], published["command"])
    assert again["recorded_decode_step_s"] == published["recorded_decode_step_s"]
    assert again["calibration"] == published["calibration"]
    assert again["calibration_profile_only"] == published["calibration_profile_only"]
    assert again["predictions"] == published["predictions"]
    assert again["paper_apps_here"] == published["paper_apps_here"]
    assert again["load_what_if"] == published["load_what_if"]
    rows = [r for systems in published["calibration"].values() for s, r in systems.items() if s != "poisson"]
    assert {"plain-sequential", "plain-concurrent", "teola-full"} <= {
        s for systems in published["calibration"].values() for s in systems}
    assert all(r["predicted_mean_s"] > 0 and r["measured_mean_s"] > 0 for r in rows)
    assert (root / "docs/benchmarks/simulation.md").read_text() == report.render(published)


def test_simulate_without_traces_says_what_to_run(tmp_path, capsys):
    from teola_plugin.cli import main

    (tmp_path / "results.json").write_text(json.dumps({"apps": {}, "command": "teola bench --no-bound"}))
    (tmp_path / "traces.json").write_text(json.dumps({"apps": {}}))
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--results", str(tmp_path / "results.json"), "--out", str(tmp_path / "s.json"),
              "--page", str(tmp_path / "s.md")])
    assert exit_.value.code == 2
    assert "holds no query traces" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()
