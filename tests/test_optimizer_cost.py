"""CostModel: curves, profile files, and what a primitive's cost is made of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from teola_plugin.errors import ConfigError
from teola_plugin.ir import Op, PGraph, PortType
from teola_plugin.optimizer import CostModel, Curve


def test_curve_interpolates_clamps_and_extrapolates():
    c = Curve((1, 10, 20), (1.0, 10.0, 30.0))
    assert c(5.5) == pytest.approx(5.5)
    assert c(15) == pytest.approx(20.0)
    assert c(0.5) == 1.0  # below the first point: the first latency
    assert c(30) == pytest.approx(50.0)  # beyond the last: the last slope continues
    assert Curve((4,), (0.25,))(100) == 0.25


@pytest.mark.parametrize("batch,lat", [((), ()), ((1, 1), (1, 2)), ((2, 1), (1, 2)), ((1,), (-1,))])
def test_bad_curves_are_config_errors(batch, lat):
    with pytest.raises(ConfigError):
        Curve(batch, lat)


def test_defaults_match_the_measured_ballparks():
    m = CostModel.default()
    assert m.latency("embedder", Op.EMBED, 1) == pytest.approx(0.06)
    assert 32 / m.latency("embedder", Op.EMBED, 32) == pytest.approx(350, rel=0.01)
    assert m.latency("vector_store", Op.VECTOR_INSERT, 1000) == pytest.approx(0.401)
    assert 100 / m.latency("llm", Op.LLM_DECODE, 100) == pytest.approx(49, rel=0.03)
    assert m.latency("llm", Op.LLM_PREFILL, 1800) == pytest.approx(1.01, rel=0.02)
    assert m.latency("nobody", "nothing", 5) == pytest.approx(0.001)  # unprofiled fallback


def test_profile_file_overrides_per_op_and_instance_names_win(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "profiles": {
            "embedder": {"embed": {"batch": [0, 100], "latency_s": [0.01, 0.11]}},
            "gpu_embedder": {"embed": {"batch": [1], "latency_s": [0.002]}},
        },
        "meta": {"device": "test"},
    }))
    m = CostModel.from_file(path)
    assert m.latency("embedder", Op.EMBED, 50) == pytest.approx(0.06)
    assert m.latency("gpu_embedder", Op.EMBED, 50, kind="embedder") == pytest.approx(0.002)
    assert m.latency("embedder_2", Op.EMBED, 50, kind="embedder") == pytest.approx(0.06)  # kind fallback
    assert m.latency("vector_store", Op.VECTOR_SEARCH, 1) == pytest.approx(0.0013)  # default kept
    assert str(path) in repr(m)
    assert CostModel.from_dict(m.to_dict()).latency("embedder", Op.EMBED, 50) == pytest.approx(0.06)


def test_malformed_profiles_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no 'profiles'"):
        CostModel.from_dict({"embedder": {}})
    with pytest.raises(ConfigError, match="malformed"):
        CostModel.from_dict({"profiles": {"embedder": {"embed": {"batch": [1]}}}})
    with pytest.raises(ConfigError, match="cannot read"):
        CostModel.from_file(tmp_path / "missing.json")


def prim(op, **attrs):
    g = PGraph()
    return g.add(op, attrs=attrs)


def test_node_cost_reads_items_shards_streams_and_tokens():
    m = CostModel.from_dict({"profiles": {
        "embedder": {"embed": {"batch": [1, 101], "latency_s": [1.0, 101.0]}},
        "llm": {"llm_prefill": {"batch": [1, 1001], "latency_s": [0.001, 1.001]},
                "llm_decode": {"batch": [1, 101], "latency_s": [1.0, 101.0]}}}})
    assert m.node_cost(prim(Op.EMBED)) == pytest.approx(1.0)  # est_items defaults to 1
    assert m.node_cost(prim(Op.EMBED, est_items=40)) == pytest.approx(40.0)
    assert m.node_cost(prim(Op.EMBED, est_items=40, shard=(0, 3))) == pytest.approx(14.0)  # ceil(40/3)
    assert m.node_cost(prim(Op.EMBED, est_items=40, stream_from="d")) == pytest.approx(1.0)
    assert m.node_cost(prim(Op.EMBED, est_items=40), items=7) == pytest.approx(7.0)
    assert m.node_cost(prim(Op.LLM_PREFILL, est_prompt_tokens=500)) == pytest.approx(0.5)
    assert m.node_cost(prim(Op.LLM_PREFILL, est_prompt_tokens=500, cached_prefix_tokens=100)) == pytest.approx(0.4)
    assert m.node_cost(prim(Op.LLM_DECODE, max_tokens=20)) == pytest.approx(20.0)
    assert m.node_cost(prim(Op.EMBED, est_items=40, est_latency_s=3.5)) == 3.5


def test_engine_instance_profile_is_used_for_a_primitive():
    m = CostModel({"fast": {"embed": {"batch": [1], "latency_s": [0.5]}}})
    g = PGraph()
    e = g.add(Op.EMBED, inputs={"texts": g.input("t", PortType.TEXTS)}, engine="fast")
    assert m.node_cost(e) == 0.5


PROFILE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "engine_profiles.json"


@pytest.mark.skipif(not PROFILE.exists(), reason="no measured engine profile checked in")
def test_the_measured_engine_profile_loads_and_drives_the_optimizer():
    from teola_plugin.capture.app_graphs import advanced_rag
    from teola_plugin.optimizer import optimize

    measured = CostModel.from_file(PROFILE)
    for kind, op in [("embedder", Op.EMBED), ("vector_store", Op.VECTOR_SEARCH), ("llm", Op.LLM_PREFILL),
                     ("llm", Op.LLM_DECODE)]:
        assert measured.latency(kind, op, 8) > 0
        assert measured.latency(kind, op, 8) != CostModel.default().latency(kind, op, 8)  # really measured
    g = advanced_rag()
    assert optimize(g, cost_model=measured).critical_path(measured)[0] < g.critical_path(measured)[0]


def test_best_batch_is_the_measured_size_with_the_most_items_per_second():
    m = CostModel({"embedder": {"embed_pass": {"batch": [1, 8, 32], "latency_s": [0.04, 0.2, 1.2]}}})
    assert m.best_batch("embedder", "embed_pass") == 8  # 40/s beats 25/s (1) and 26.7/s (32)
    assert m.best_batch("embedder_gpu", "embed_pass", kind="embedder") == 8  # by kind
    assert m.best_batch("nobody", "nothing") is None
    # the built-in profile is this machine's measurement: a CPU pass peaks below the library's 32
    assert CostModel.default().best_batch("embedder", "embed_pass") < 32
