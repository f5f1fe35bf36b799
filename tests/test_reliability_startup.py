"""A query's timeout covers starting its engines: an engine Ray cannot place (or one that
never finishes starting) fails the query with a clear timeout naming the engine and the
resources it asked for, instead of hanging; a failed or abandoned start leaves nothing
"starting" and no replica behind, so a later query tries again."""

from __future__ import annotations

import asyncio

import pytest

from teola_plugin.errors import EngineStartTimeoutError, ModelNotFoundError, QueryTimeoutError
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.runtime.hosting import EngineSpec
from teola_plugin.runtime.runtime import Runtime

EMBEDDER = "teola_plugin.engines.embedder:SentenceTransformerEmbedder"


def embed_graph(engine: str) -> PGraph:
    g = PGraph("embed_only")
    texts = g.input("texts", T.TEXTS)
    g.output("vectors", g.add("embed", inputs={"texts": texts}, engine=engine).out())
    return g


def live_replicas(engine: str) -> list[str]:
    import ray.util

    return [n for n in ray.util.list_named_actors() if n.startswith(f"teola-engine-{engine}-")]


@pytest.mark.slow
def test_an_engine_ray_cannot_place_fails_the_query_in_time_naming_what_it_asked_for(runtime):
    """num_gpus=1 on a machine without GPUs: Ray never places the actor. The query must end
    at its timeout (it hung before), the pending actor must be killed (it stayed, to be placed
    whenever a GPU appeared), and a later query must get the same error, not hang on it."""
    # Shares the session's Ray (started by `runtime`); owns only its own engine.
    rt = Runtime({"gpu_embedder": EngineSpec("gpu_embedder", EMBEDDER, kind="embedder", num_gpus=1)})
    graph = embed_graph("gpu_embedder")
    try:
        for attempt in range(2):
            with pytest.raises(EngineStartTimeoutError) as caught:
                rt.run_sync(rt.execute(graph, {"texts": ["a"]}, query_id=f"q{attempt}", timeout_s=2), timeout=60)
            message = str(caught.value)
            assert isinstance(caught.value, QueryTimeoutError)  # what callers already catch
            assert "query q%d did not start within its timeout_s=2" % attempt in message
            assert "engine 'gpu_embedder' did not start" in message and "GPU=1" in message, message
            assert "no node of the Ray cluster has them" in message, message
            assert rt._starts.in_progress == {} and live_replicas("gpu_embedder") == []
    finally:
        rt.shutdown()
    assert not asyncio.all_tasks(rt.loop)  # nothing left to be destroyed pending
    assert runtime.run_sync(runtime.engines("embedder").submit("embed", {"texts": ["still fine"]}, _priority()))


def test_a_failed_start_is_not_remembered_and_each_query_gets_its_error(tmp_path):
    """Local hosting, an embedder whose model directory does not exist: every query fails
    with the engine's own error (a retry each time), never waits on a dead start."""
    missing = tmp_path / "no-model-here"
    rt = Runtime({"broken": EngineSpec("broken", EMBEDDER, {"model_path": str(missing)}, kind="embedder")},
                 hosting="local")
    graph = embed_graph("broken")
    try:
        for _ in range(2):
            with pytest.raises(ModelNotFoundError, match="no-model-here"):
                rt.run_sync(rt.execute(graph, {"texts": ["a"]}, timeout_s=60), timeout=120)
            assert rt._starts.in_progress == {} and "broken" not in rt._pools
    finally:
        rt.shutdown()


def _priority():
    from teola_plugin.runtime.policies import Priority

    return Priority()
