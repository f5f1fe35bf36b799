"""QueryFusionRetriever, BM25Retriever, LLMRerank and the opaque-component warning under
TeolaExecutor vs plain LlamaIndex, on the real engines (greedy decoding).

Query fusion makes one LLM call, so its prompt and (greedy) answer are the same on both
paths; the generated queries are then embedded together with the original one, so scores
are compared to 1e-5. LLMRerank's batches are independent calls that Teola decodes
concurrently, and vLLM batching alone can change greedy tokens, so for it the requests
and the retrieved node ids are compared, not the reranked order.
"""

from __future__ import annotations

import logging

import pytest
from llama_index.core import Settings
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.postprocessor import LLMRerank
from llama_index.core.postprocessor.sbert_rerank import SentenceTransformerRerank
from llama_index.core.retrievers import QueryFusionRetriever

from teola_plugin.capture import llama_index as capture
from tests.test_llama_index import (  # noqa: F401  (module fixtures reused)
    QUESTIONS,
    executor,
    ids,
    index,
    llm,
    plain_prompts,
    plain_settings,
    teola_prompts,
)

pytestmark = pytest.mark.slow
# Every mode and the parsing corners are covered without engines in test_llama_index_fusion_unit.
MODES = ["reciprocal_rerank", "relative_score"]


def fusion(retrievers, llm, mode, **kwargs):
    return QueryFusionRetriever(retrievers, llm=llm, mode=mode, num_queries=3, similarity_top_k=4, **kwargs)


def assert_same_nodes(teola, plain):
    assert ids(teola) == ids(plain) and plain
    assert [n.score for n in teola] == pytest.approx([n.score for n in plain], abs=1e-5)


def test_query_fusion_matches_plain_llamaindex(runtime, index, llm, executor):
    from teola_plugin.errors import ConfigError
    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.optimizer import CostModel

    question = QUESTIONS[1]
    # On this CPU-only machine the runtime's cost model (every engine on the same cores)
    # declines decode pipelining; planned as if each engine had its own hardware, the
    # pipelined path runs on the real engines and must give the same nodes.
    default_plan = executor._prepare(executor.trace(fusion([index.as_retriever()], llm, MODES[0])))
    assert not any(p.attrs.get("stream_items") for p in default_plan.nodes)
    with pytest.raises(ConfigError, match="cost_model"):
        TeolaExecutor(runtime=runtime, cost_model={"llm": "gpu"})
    executor = TeolaExecutor(runtime=runtime, cost_model=CostModel.default())
    for mode in MODES:
        retriever = fusion([index.as_retriever(similarity_top_k=3)], llm, mode, use_async=mode == "relative_score")
        with plain_prompts() as sent_plain:
            plain = retriever.retrieve(question)
        with teola_prompts(runtime) as sent_teola:
            teola = executor.retrieve(retriever, question)
        assert sent_teola == sent_plain and len(sent_plain) == 1  # the query-generation call
        assert_same_nodes(teola, plain)
    # The generated queries are searched per decoded line (decode pipelining).
    graph = executor._prepare(executor.trace(retriever))
    decode = next(p for p in graph.nodes if p.op.value == "llm_decode")
    assert decode.attrs.get("stream_items") and decode.attrs["parse"] == "lines"
    assert any(p.attrs.get("stream_from") == decode.name for p in graph.nodes if p.op.value == "vector_search")
    assert executor.traced(retriever).opaque == []


def test_query_fusion_over_vector_and_bm25_retrievers(runtime, index, llm, executor):
    from llama_index.retrievers.bm25 import BM25Retriever

    bm25 = BM25Retriever.from_defaults(index=index, similarity_top_k=3)
    retriever = fusion([index.as_retriever(similarity_top_k=3), bm25], llm, "reciprocal_rerank")
    assert executor.traced(retriever).opaque == []  # BM25 is a CPU step, not an opaque one
    question = QUESTIONS[2]
    plain = retriever.retrieve(question)
    Settings.executor = executor  # through the drop-in hook
    teola = retriever.retrieve(question)
    assert_same_nodes(teola, plain)
    assert ids(bm25.retrieve(question)) == ids(executor.retrieve(bm25, question))


class Broken(BaseRetriever):
    def _retrieve(self, query_bundle):
        raise KeyError("shard 7 is offline")


def test_a_failing_sub_retriever_raises_the_same_error(index, llm, executor):
    retriever = fusion([index.as_retriever(similarity_top_k=2), Broken()], llm, "simple", use_async=False)
    with pytest.raises(KeyError, match="shard 7 is offline"):
        retriever.retrieve(QUESTIONS[0])
    with pytest.raises(KeyError, match="shard 7 is offline"):
        executor.retrieve(retriever, QUESTIONS[0])


def test_llm_rerank_sends_the_same_batched_requests(runtime, index, llm, executor):
    rerank = LLMRerank(llm=llm, choice_batch_size=2, top_n=2)
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=4, node_postprocessors=[rerank])
    question = QUESTIONS[0]
    retrieved = ids(index.as_retriever(similarity_top_k=4).retrieve(question))

    def run(call, recorder):
        with recorder as sent:
            try:
                outcome = ids(call(question).source_nodes)
            except Exception as exc:  # the small model may answer outside the choice format
                outcome = type(exc)
        rerank_requests = sorted(repr(p) for p in sent if "A list of documents is shown below" in repr(p))
        return outcome, rerank_requests

    plain, plain_requests = run(query_engine.query, plain_prompts())
    teola, teola_requests = run(lambda q: executor.query(query_engine, q), teola_prompts(runtime))
    assert len(plain_requests) == 2 and teola_requests == plain_requests  # two batches of two nodes
    if isinstance(teola, list):
        assert set(teola) <= set(retrieved) and len(teola) <= 2
    text = executor.explain(query_engine)
    assert "llm_rerank (LLMRerank)" in text and "Opaque components: none" in text


def test_cross_encoder_rerank_stays_opaque_and_warns_once(index, llm, executor, caplog):
    # model_construct: no CrossEncoder weights are loaded (none exist offline).
    rerank = SentenceTransformerRerank.model_construct(top_n=2, model="cross-encoder/ms-marco-MiniLM-L-6-v2",
                                                       device="cpu", keep_retrieval_score=False)
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=3, node_postprocessors=[rerank])
    capture.warn_opaque_once.warned.discard(SentenceTransformerRerank)
    with caplog.at_level(logging.WARNING, logger="teola_plugin"):
        text = executor.explain(query_engine)
        executor.trace(query_engine)
    assert "SentenceTransformerRerank" in text and "cross-encoder" in text and "bi-encoder" in text
    warnings = [r for r in caplog.records if "SentenceTransformerRerank" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].name.startswith("teola_plugin") and "bi-encoder" in warnings[0].getMessage()


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    # No trained cross-encoder weights exist offline. This is a real sequence-classification
    # checkpoint: the bundled MiniLM encoder plus a seeded one-output head, saved once so every
    # load gets the same head. Its scores are deterministic but untrained (meaningless as
    # relevance): the tests compare plumbing, Teola vs plain LlamaIndex on the same checkpoint.
    import torch
    import transformers

    from teola_plugin.engines.embedder import default_model_path

    path = tmp_path_factory.mktemp("cross_encoder")
    torch.manual_seed(1234)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1)
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(path)
    return str(path)


@pytest.fixture
def cross_encoder_engine(runtime, cross_encoder_dir):
    """A reranker engine serving that checkpoint in-process (LlamaIndex's max_length), only for the test."""
    from teola_plugin.engines.reranker import Reranker

    name = "ce_reranker"
    engine = Reranker(cross_encoder_path=cross_encoder_dir, max_length=512)
    runtime.run_sync(runtime.add_local_engine(name, engine), timeout=300)
    yield name
    pool = runtime._pools.pop(name)  # later tests see the session runtime as it was
    runtime.run_sync(pool.close(), timeout=60)


def test_cross_encoder_rerank_without_a_serving_engine_stays_opaque(index, llm, executor, cross_encoder_dir):
    rerank = SentenceTransformerRerank(model=cross_encoder_dir, top_n=2, device="cpu")
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=3, node_postprocessors=[rerank])
    (note,) = executor.traced(query_engine).opaque
    assert note.component == "SentenceTransformerRerank"
    assert cross_encoder_dir in note.reason and "'reranker'" in note.reason and "bi-encoder" in note.reason
    assert "which no Teola reranker engine serves" in executor.explain(query_engine)


def test_cross_encoder_rerank_lowers_onto_the_engine_serving_it(index, llm, executor, cross_encoder_dir,
                                                                 cross_encoder_engine):
    rerank = SentenceTransformerRerank(model=cross_encoder_dir, top_n=2, device="cpu")
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=4, node_postprocessors=[rerank])
    traced = executor.traced(query_engine)
    assert traced.opaque == []
    (prim,) = [p for p in traced.graph.nodes if p.op.value == "rerank"]
    assert prim.engine == cross_encoder_engine and prim.origin == "SentenceTransformerRerank"
    question = QUESTIONS[2]
    plain = query_engine.query(question).source_nodes
    teola = executor.query(query_engine, question).source_nodes
    assert len(plain) == 2  # top_n of the 4 retrieved
    assert_same_nodes(teola, plain)
    # All four scored and sorted the same way (top_n larger than the retrieved nodes).
    everything = SentenceTransformerRerank(model=cross_encoder_dir, top_n=10, device="cpu")
    retriever_engine = index.as_query_engine(llm=llm, similarity_top_k=4, node_postprocessors=[everything])
    plain_all = everything.postprocess_nodes(index.as_retriever(similarity_top_k=4).retrieve(question),
                                             query_str=question)
    teola_all = executor.query(retriever_engine, question).source_nodes
    assert len(plain_all) == 4 and len({round(float(n.score), 6) for n in plain_all}) == 4  # an order to keep
    assert_same_nodes(teola_all, plain_all)
    # Settings that change scores must match: a different truncation stays opaque, saying why.
    rerank._model.max_seq_length = 256
    other = index.as_query_engine(llm=llm, similarity_top_k=4, node_postprocessors=[rerank])
    (note,) = executor.traced(other).opaque
    assert "max_length=256" in note.reason and "max_length=512" in note.reason and cross_encoder_engine in note.reason


def test_auto_merging_retriever_merges_what_its_lowered_retriever_finds_as_plain(runtime, llm, executor):
    """LlamaIndex's auto-merging guide: hierarchical nodes, the leaves indexed, every node in the
    docstore; ``AutoMergingRetriever`` over the leaves' retriever. Its vector search is lowered
    and its own merging runs on what that found: the same merged nodes as plain's."""
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import HierarchicalNodeParser, get_leaf_nodes
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import AutoMergingRetriever

    from teola_plugin import datasets
    from teola_plugin.llama_index import TeolaEmbedding

    text = "\n\n".join(p.text for p in datasets.load_corpus("squad-xquad-en")[:6])
    parser = HierarchicalNodeParser.from_defaults(chunk_sizes=[512, 128, 64], chunk_overlap=0)
    nodes = parser.get_nodes_from_documents([Document(text=text, id_="doc")])
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(nodes)
    leaves = VectorStoreIndex(get_leaf_nodes(nodes), storage_context=storage, embed_model=TeolaEmbedding(runtime=runtime))
    retriever = AutoMergingRetriever(leaves.as_retriever(similarity_top_k=12), storage, simple_ratio_thresh=0.3)
    question = QUESTIONS[0]
    plain = retriever.retrieve(question)
    app = executor.traced(retriever)
    assert app.opaque == [], [str(n) for n in app.opaque]
    teola = executor.retrieve(retriever, question)
    assert_same_nodes(teola, plain)
    merged = {n.node.node_id for n in plain} - {n.node.node_id for n in leaves.as_retriever(similarity_top_k=12)
                                               .retrieve(question)}
    assert merged  # some leaves were merged into their parents
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    assert executor.traced(engine).opaque == []
    assert ids(executor.query(engine, question).source_nodes) == ids(engine.query(question).source_nodes)
