"""The runtime sizes a CPU embedder's forward passes from the measured profile, and only there."""

from __future__ import annotations

from teola_plugin.optimizer import CostModel
from teola_plugin.runtime.engine_tuning import tuned
from teola_plugin.runtime.hosting import EngineSpec

EMBEDDER = "teola_plugin.engines.embedder:SentenceTransformerEmbedder"
PROFILE = CostModel({"embedder": {"embed_pass": {"batch": [4, 16, 64], "latency_s": [0.2, 0.4, 3.2]}}})


def test_a_cpu_embedder_gets_the_profiles_most_efficient_pass_size():
    spec = tuned(EngineSpec("embedder", EMBEDDER, {"model_path": "/m"}, kind="embedder"), PROFILE)
    assert spec.kwargs == {"model_path": "/m", "batch_size": 16}  # 40 texts/s at 16, 20 at 4 and 64
    assert spec.build().batch_size == 16


def test_what_the_user_set_a_gpu_engine_and_other_kinds_are_left_alone():
    own = EngineSpec("embedder", EMBEDDER, {"batch_size": 64}, kind="embedder")
    gpu = EngineSpec("embedder", EMBEDDER, kind="embedder", num_gpus=1)
    cuda = EngineSpec("embedder", EMBEDDER, {"device": "cuda"}, kind="embedder")
    other = EngineSpec("reranker", "teola_plugin.engines.reranker:Reranker", kind="reranker")
    for spec in (own, gpu, cuda, other):
        assert tuned(spec, PROFILE) is spec


def test_another_embedder_class_without_the_setting_starts_as_it_is():
    """A user's own embedder engine (here the scheduler benchmark's no-op one) takes no
    batch_size: it is not given one (it failed to start with a TypeError before)."""
    noop = EngineSpec("embedder", "teola_plugin.bench.noop_engine:NoopEmbedder", kind="embedder")
    assert tuned(noop, PROFILE) is noop
    noop.build()
