"""LlamaIndex's own HuggingFaceEmbedding and Vllm, recognised as the runtime's engines.

``HuggingFaceEmbedding`` on the bundled model directory is the embedder engine's model, so
its query embedding is lowered (with a query instruction it is not). ``Vllm`` is built with
``model_construct`` (pydantic: no vLLM model is loaded) and given a client that passes its
prompt and ``SamplingParams`` to the runtime's vLLM engine, which is exactly what
``vllm.LLM.generate`` would compute on the same model; the executor then must send the
same requests itself.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from llama_index.core import Document, VectorStoreIndex

from teola_plugin import datasets
from tests.test_llama_index import (  # noqa: F401  (module fixtures reused)
    QUESTIONS,
    assert_same_response,
    executor,
    ids,
    index,
    plain_settings,
    teola_prompts,
)

pytestmark = pytest.mark.slow


def documents(n: int) -> list[Document]:
    return [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:n]]


def test_huggingface_embedding_of_the_engine_model_is_lowered(runtime, executor):
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.capture.llama_index_models import embedder_engine_for
    from teola_plugin.engines.embedder import default_model_path

    model = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")
    index = VectorStoreIndex.from_documents(documents(12), embed_model=model)
    retriever = index.as_retriever(similarity_top_k=3)
    app = executor.traced(retriever)
    assert app.opaque == [] and [p.engine for p in app.graph.nodes if p.op.value == "embed"] == ["embedder"]
    for question in QUESTIONS[:2]:
        plain = retriever.retrieve(question)
        teola = executor.retrieve(retriever, question)
        assert ids(teola) == ids(plain) and len(plain) == 3
        assert [n.score for n in teola] == pytest.approx([n.score for n in plain], abs=1e-5)

    instructed = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu",
                                      query_instruction="query: ")
    other = VectorStoreIndex.from_documents(documents(2), embed_model=instructed).as_retriever()
    (note,) = executor.traced(other).opaque
    assert note.component == "HuggingFaceEmbedding" and "query instruction" in note.reason
    # a text instruction changes the stored vectors: the index's nodes would not match the engine's
    passages = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu", text_instruction="passage: ")
    engine, why = embedder_engine_for(executor.runtime, passages)
    assert engine is None and "text instruction" in why
    truncated = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")
    truncated._model.truncate_dim = 128  # sentence-transformers' own setting (no constructor argument here)
    engine, why = embedder_engine_for(executor.runtime, truncated)
    assert engine is None and "truncate_dim" in why


HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the bundled model's hub id, as the docs write it


def hub_cache(root, model_dir, edit=None):
    """A Hugging Face hub cache holding ``HUB_ID``'s snapshot: the files of ``model_dir``
    (links, as the hub links its blobs), one of them rewritten by ``edit(name) -> bytes``."""
    snapshot = root / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / ("0" * 40)
    for source in model_dir.rglob("*"):
        if source.is_file():
            target = snapshot / source.relative_to(model_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            changed = edit(source.relative_to(model_dir).as_posix()) if edit else None
            target.write_bytes(changed) if changed is not None else target.symlink_to(source)
    (snapshot.parents[1] / "refs").mkdir(parents=True)
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    return root


def test_an_embedding_model_named_by_hub_id_is_the_engines_when_its_cached_files_are(runtime, executor, tmp_path,
                                                                                      monkeypatch):
    """``HuggingFaceEmbedding(model_name="sentence-transformers/all-MiniLM-L6-v2")`` as the docs
    write it loads the hub cache's snapshot: the same files as the engine's model make it the
    engine's (LlamaIndex and LangChain alike); one file changed, or no snapshot, keeps it opaque."""
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_huggingface import HuggingFaceEmbeddings
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.capture.llama_index_models import embedder_engine_for
    from teola_plugin.engines.embedder import default_model_path
    from teola_plugin.langchain import TeolaRunnable

    model_dir = default_model_path()
    same = hub_cache(tmp_path / "same", model_dir)
    monkeypatch.setenv("LLAMA_INDEX_CACHE_DIR", str(same))  # where LlamaIndex's class caches hub models
    model = HuggingFaceEmbedding(model_name=HUB_ID, device="cpu")
    retriever = VectorStoreIndex.from_documents(documents(12), embed_model=model).as_retriever(similarity_top_k=3)
    app = executor.traced(retriever)
    assert app.opaque == [] and [p.engine for p in app.graph.nodes if p.op.value == "embed"] == ["embedder"]
    plain, teola = retriever.retrieve(QUESTIONS[0]), executor.retrieve(retriever, QUESTIONS[0])
    assert ids(teola) == ids(plain) and [n.score for n in teola] == pytest.approx([n.score for n in plain], abs=1e-5)

    embeddings = HuggingFaceEmbeddings(model_name=HUB_ID, cache_folder=str(same),
                                       encode_kwargs={"normalize_embeddings": True})
    store = InMemoryVectorStore.from_texts([p.text for p in datasets.load_corpus("squad-xquad-en")[:12]], embeddings)
    lc_retriever = store.as_retriever(search_kwargs={"k": 3})
    wrapped = TeolaRunnable(lc_retriever, runtime=runtime)
    assert wrapped._plan(QUESTIONS[0]).trace.opaque == []
    assert [d.page_content for d in wrapped.invoke(QUESTIONS[0])] == [
        d.page_content for d in lc_retriever.invoke(QUESTIONS[0])]

    def cls_pooling(name):  # the same weights pooled another way: other vectors
        return (b'{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}'
                if name == "1_Pooling/config.json" else None)

    changed = hub_cache(tmp_path / "changed", model_dir, edit=cls_pooling)
    monkeypatch.setenv("LLAMA_INDEX_CACHE_DIR", str(changed))
    engine, why = embedder_engine_for(runtime, HuggingFaceEmbedding(model_name=HUB_ID))
    assert engine is None and "1_Pooling/config.json differs" in why, why
    pooled_otherwise = HuggingFaceEmbeddings(model_name=HUB_ID, cache_folder=str(changed),
                                             encode_kwargs={"normalize_embeddings": True})
    other_store = InMemoryVectorStore.from_texts(["a passage"], pooled_otherwise)
    (note,) = TeolaRunnable(other_store.as_retriever(), runtime=runtime)._plan("q").trace.opaque
    assert "1_Pooling/config.json differs" in note.reason, note.reason
    def with_a_dense_layer(name):  # one more module listed: the snapshot's pipeline differs
        return (model_dir / name).read_bytes().replace(b"]", b', {"idx": 2, "name": "2", "path": "2_Dense", '
                                                             b'"type": "sentence_transformers.models.Dense"}]') \
            if name == "modules.json" else None

    from teola_plugin.capture.model_files import first_difference, local_model_dir
    extra = hub_cache(tmp_path / "extra", model_dir, edit=with_a_dense_layer)
    snapshot = local_model_dir(HUB_ID, [str(extra)])
    (snapshot / "2_Dense").mkdir()
    (snapshot / "2_Dense" / "config.json").write_text("{}")
    assert first_difference(model_dir, snapshot) == "2_Dense/config.json is only in " + str(snapshot)
    assert first_difference(model_dir, local_model_dir(HUB_ID, [str(same)])) is None
    assert local_model_dir(HUB_ID, [str(tmp_path / "empty")]) is None  # nothing cached: unknown
    assert local_model_dir(HUB_ID, [str(tmp_path / "empty"), str(same)]).parent.name == "snapshots"


class EngineClient:
    """Stands in for ``vllm.LLM`` inside ``Vllm.complete``: its prompt and SamplingParams go
    to the runtime's vLLM engine (the same model); records the prompts."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.sent: list[str] = []

    def generate(self, prompts, sampling_params):
        (prompt,) = prompts
        self.sent.append(prompt)
        params = {"temperature": sampling_params.temperature, "max_tokens": sampling_params.max_tokens,
                  "top_p": sampling_params.top_p, "top_k": sampling_params.top_k}
        generation = self.runtime.run_sync(self.runtime.engines("llm").call("generate", prompt, params))
        return [SimpleNamespace(outputs=[SimpleNamespace(text=generation.text)])]


def test_llama_index_vllm_on_the_engine_model_is_lowered(runtime, index, executor, monkeypatch):
    import vllm
    from llama_index.llms.vllm import Vllm

    # Vllm.complete always passes best_of=..., which the installed vLLM's SamplingParams no
    # longer accepts (plain Vllm raises TypeError); keep its other parameters as given.
    monkeypatch.setattr(vllm, "SamplingParams", lambda best_of=None, **params: SimpleNamespace(**params))

    engine = runtime.run_sync(runtime.engines("llm").call("describe"))
    served = engine["model"]  # loaded as the engine loads it (on a CPU without bf16: float32)
    llm = Vllm.model_construct(model=served, dtype=engine["dtype"], temperature=0.0, max_new_tokens=24)
    llm._client = client = EngineClient(runtime)
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=2)
    assert executor.traced(query_engine).opaque == []
    question = QUESTIONS[3]
    plain = query_engine.query(question)
    with teola_prompts(runtime) as sent_teola:
        teola = executor.query(query_engine, question)
    assert sent_teola == client.sent and len(client.sent) == 1  # the same completion prompt
    assert_same_response(teola, plain)

    other = Vllm.model_construct(model="/no/such/model", dtype=engine["dtype"], temperature=0.0, max_new_tokens=24)
    (note,) = executor.traced(index.as_query_engine(llm=other)).opaque
    assert note.component == "CompactAndRefine" and "is not the model of a Teola LLM engine" in note.reason
    sampled = Vllm.model_construct(model=served, dtype=engine["dtype"], temperature=0.0, max_new_tokens=24,
                                   presence_penalty=0.5)
    (note,) = executor.traced(index.as_query_engine(llm=sampled)).opaque
    assert "presence_penalty" in note.reason


def test_vllm_loaded_unlike_the_engine_stays_opaque_and_says_how():
    """Tracing only, on a runtime never started: how its engine loads the model comes from
    the engine spec (no engine call), and LangChain's VLLM rule judges it the same way."""
    import dataclasses

    from langchain_community.llms import VLLM
    from langchain_core.prompts import PromptTemplate
    from llama_index.llms.vllm import Vllm

    from teola_plugin.capture.langchain import InputLayout, trace_runnable
    from teola_plugin.capture.vllm_identity import served_models
    from teola_plugin.config import default_model_dir
    from teola_plugin.llama_index import TeolaEmbedding, TeolaExecutor
    from teola_plugin.runtime.runtime import Runtime, default_engine_specs

    specs = default_engine_specs()
    specs["llm"] = dataclasses.replace(specs["llm"], kwargs={"engine_kwargs": {"quantization": "fp8"}})
    runtime = Runtime(specs, hosting="local")
    executor = TeolaExecutor(runtime=runtime, start_engines=False)  # tracing only: no engine starts
    index = VectorStoreIndex([], embed_model=TeolaEmbedding(runtime=runtime))
    served = str(default_model_dir())

    loaded = served_models(runtime)["llm"].dtype  # "auto", or float32 on a CPU without bf16 (engines/cpu_dtype.py)

    def query_engine(**loading):
        llm = Vllm.model_construct(model=served, temperature=0.0, max_new_tokens=8, **{"dtype": loaded, **loading})
        return index.as_query_engine(llm=llm)

    same = query_engine(vllm_kwargs={"quantization": "fp8", "gpu_memory_utilization": 0.5})  # placement differs
    app = executor.traced(same)
    assert app.opaque == [] and [n.component for n in app.notes if n.kind == "expands"] == ["CompactAndRefine"]

    for loading, difference in [
        ({"dtype": "float16", "vllm_kwargs": {"quantization": "fp8"}}, f"dtype 'float16' (engine: {loaded!r})"),
        ({"vllm_kwargs": {}}, "quantization None (engine: 'fp8')"),
        ({"vllm_kwargs": {"quantization": "fp8", "max_model_len": 2048}}, "max_model_len 2048 (engine: 4096)"),
    ]:
        (note,) = executor.traced(query_engine(**loading)).opaque
        assert note.component == "CompactAndRefine" and difference in note.reason, note.reason
    assert f"dtype 'float16' (engine: {loaded!r})" in executor.explain(query_engine(dtype="float16"))
    assert runtime.loop is None  # recognising a Vllm never called an engine

    # The LangChain rule shares the judgement (capture/vllm_identity.py).
    chain = PromptTemplate.from_template("Q: {q}") | VLLM.model_construct(model=served, dtype="float16")
    (opaque,) = trace_runnable(chain, InputLayout.of({"q": "x"}), engine_models=served_models(runtime)).opaque
    assert f"dtype 'float16' (engine: {loaded!r})" in opaque.reason
