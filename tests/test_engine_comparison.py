"""scripts/compare_engines.py's measurements, on a few texts: every configuration really runs
(the library, the engine as the runtime configures it, the library's default pass size)."""

from __future__ import annotations

from teola_plugin.bench.engine_comparison import compare_embedder, compare_vector_store
from teola_plugin.optimizer import CostModel


def test_the_embedder_comparison_runs_the_library_and_the_engine_as_the_runtime_configures_it():
    out = compare_embedder(n_texts=8, repeats=1, pass_sizes=(1, 4), call_sizes=(1, 8), ray=False)
    assert out["engine_pass_size"] == CostModel.default().best_batch("embedder", "embed_pass")
    assert set(out["library_per_pass_size"]) == {1, 4} and out["library_best"]["pass_size"] in (1, 4)
    assert set(out["engine_per_call"]) == {1, 8}
    rates = [*out["library_per_pass_size"].values(), out["engine"], out["engine_library_default"],
             *out["engine_per_call"].values()]
    assert all(r > 0 for r in rates)


def test_the_vector_store_comparison_stores_and_searches_with_both():
    out = compare_vector_store(n=300, queries=4, repeats=1)
    assert out["library"]["inserts_per_s"] > 0 and out["engine"]["inserts_per_s"] > 0
    assert out["library"]["queries_per_s"] > 0 and out["engine"]["queries_per_s"] > 0


def test_the_page_judges_each_engine_against_its_librarys_best():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "compare_engines", Path(__file__).resolve().parents[1] / "scripts" / "compare_engines.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = {"meta": {"device": "cpu", "python": "3.11", "date": "today", "repeats": 2},
              "embedder": {"texts": 64, "item": "x", "library_per_pass_size": {4: 30.0, 8: 40.0},
                           "library_best": {"pass_size": 8, "texts_per_s": 40.0}, "engine_pass_size": 8,
                           "engine": 36.0, "engine_library_default": 30.0, "engine_per_call": {1: 10.0}},
              "vector_store": {"item": "y", "library": {"inserts_per_s": 3000.0, "queries_per_s": 2000.0},
                               "engine": {"inserts_per_s": 3100.0, "queries_per_s": 1500.0}}}
    page = script.page(result)
    assert ("embedder, as the runtime configures it 1.11x slower (met); vector store inserts as fast (met); "
            "vector store searches 1.33x slower (MISSED)") in page
    assert "| 3100 | 1.03x | 1500 | 0.75x |" in page
