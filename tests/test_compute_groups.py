"""Which engines the optimizer treats as sharing hardware, from the runtime's engine specs."""

from __future__ import annotations

from teola_plugin.capture.app_graphs import naive_rag
from teola_plugin.ir.ops import Op
from teola_plugin.optimizer import PassManager
from teola_plugin.runtime.compute_groups import HOST_CPU, compute_groups
from teola_plugin.runtime.hosting import EngineSpec
from teola_plugin.runtime.runtime import Runtime, default_engine_specs


def test_gpu_engines_have_their_own_hardware_and_cpu_engines_share_the_host():
    specs = {
        "llm": EngineSpec("llm", "teola_plugin.engines.llm_vllm:VLLMEngine", kind="llm", num_gpus=1),
        "embedder": EngineSpec("embedder", "teola_plugin.engines.embedder:SentenceTransformerEmbedder",
                               {"device": "cuda:1"}, kind="embedder"),
        "store": EngineSpec("store", "teola_plugin.engines.vector_store:ChromaVectorStore", kind="vector_store"),
        "search": EngineSpec("search", "teola_plugin.engines.search:BM25SearchEngine", kind="search",
                             resources={"search_node": 1}),
    }
    assert compute_groups(specs) == {"llm": "gpu:llm", "embedder": "gpu:embedder", "store": HOST_CPU,
                                     "search": "cpu:search_node"}


def test_the_runtime_plans_with_its_own_hardware():
    """Without a GPU every default engine is on this host's cores; the runtime's cost model
    says so, and an in-process engine it has never heard of is on the host too."""
    cpu_only = Runtime(default_engine_specs(num_gpus_llm=0))
    cost = cpu_only.cost_model()
    assert cost is cpu_only.cost_model()  # one per runtime: its node-cost memo is kept
    assert {cost.compute_group(n) for n in ("llm", "embedder", "vector_store", "llama_index-store-1", "cpu")} == {
        HOST_CPU}
    pm = PassManager(["prune", "decompose"], options={"max_shards": 4})
    assert [p.name for p in pm.run(naive_rag(), cost).nodes if p.op is Op.EMBED] == ["embed", "embed_1"]
    gpu = Runtime(default_engine_specs(num_gpus_llm=1)).cost_model()
    assert gpu.compute_group("llm") == "gpu:llm" and gpu.compute_group("embedder") == HOST_CPU


def test_a_model_server_is_its_own_hardware_unless_it_runs_on_this_host():
    from teola_plugin.engines.llm_served import ServerEndpoint

    local = ServerEndpoint("http://127.0.0.1:8000/v1").engine_spec()
    remote_endpoint = ServerEndpoint("http://gpu-box:8000/v1", api_key="sk-secret-123")
    remote = remote_endpoint.engine_spec()
    assert compute_groups({local.name: local, remote.name: remote}) == {
        local.name: HOST_CPU, remote.name: "server:http://gpu-box:8000/v1"}
    assert local.in_process and local.kind == "llm"
    assert "sk-secret-123" not in remote.name and "sk-secret-123" not in repr(remote_endpoint)
