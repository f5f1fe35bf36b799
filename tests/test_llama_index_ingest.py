"""Index building under TeolaExecutor.

Eager (``defer_ingestion=False``): ``VectorStoreIndex.from_documents`` / ``insert`` embed
their nodes through one Teola query on the embedder engine. Deferred (default): the nodes
are recorded and the next query on the index embeds and inserts them in its own graph;
every other read path flushes first. Either way the index must end up with the very nodes,
ids and embeddings plain LlamaIndex stores (a deterministic ``id_func`` makes the node ids
comparable; embeddings are compared to 1e-5 since the engine batches texts differently).
"""

from __future__ import annotations

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from teola_plugin import datasets
from teola_plugin.capture.llama_index_ingest import Claim, PendingIngestion
from teola_plugin.llama_index import TeolaEmbedding, TeolaExecutor, TeolaLLM
from tests.test_llama_index import QUESTIONS, executor, ids, plain_settings  # noqa: F401

pytestmark = pytest.mark.slow


def documents(n: int, start: int = 0) -> list[Document]:
    return [Document(text=p.text, metadata={"title": p.title}, id_=p.id)
            for p in datasets.load_corpus("squad-xquad-en")[start:start + n]]


def splitter() -> SentenceSplitter:
    return SentenceSplitter(chunk_size=96, chunk_overlap=0, id_func=lambda i, doc: f"{doc.id_}#{i}")


def assert_same_index(teola: VectorStoreIndex, plain: VectorStoreIndex, min_nodes: int = 12) -> None:
    assert sorted(teola.docstore.docs) == sorted(plain.docstore.docs)
    assert teola.ref_doc_info.keys() == plain.ref_doc_info.keys()
    got, want = teola.vector_store.data.embedding_dict, plain.vector_store.data.embedding_dict
    assert list(got) == list(want) and len(want) > min_nodes  # the same nodes, in the same order
    for node_id, vector in want.items():
        assert got[node_id] == pytest.approx(vector, abs=1e-5)


def test_from_documents_and_insert_embed_on_teola_with_the_same_result(runtime):
    executor = TeolaExecutor(runtime=runtime, defer_ingestion=False)
    embed = TeolaEmbedding(runtime=runtime)
    plain = VectorStoreIndex.from_documents(documents(8), embed_model=embed, transformations=[splitter()])
    Settings.executor = executor
    teola = VectorStoreIndex.from_documents(documents(8), embed_model=embed, transformations=[splitter()])
    ingest = executor.last_query_id
    assert ingest.startswith("li-ingest") and {"embed"} == {s.op for s in runtime.timeline.spans([ingest])}
    assert_same_index(teola, plain)

    extra = documents(2, start=8)
    for doc in extra:
        teola.insert(doc)  # with the transformations from_documents kept
    assert executor.last_query_id != ingest  # the insert ran through Teola too
    Settings.executor = None
    for doc in extra:
        plain.insert(doc)
    assert_same_index(teola, plain)

    Settings.executor = executor  # and reads see everything ingested
    question = QUESTIONS[0]
    assert ids(teola.as_retriever(similarity_top_k=4).retrieve(question)) == ids(
        executor.retrieve(plain.as_retriever(similarity_top_k=4), question))


# -- deferred ingestion ---------------------------------------------------------------------------
def pending(index: VectorStoreIndex) -> bool:
    state = PendingIngestion.of(index)
    return state is not None and state.has_work()


def upstream(graph, name: str) -> set[str]:
    """Every node ``name`` waits on (data or order)."""
    seen, todo = set(), [name]
    while todo:
        prim = graph[todo.pop()]
        for dep in [r.node for r in prim.inputs.values()] + list(prim.after):
            if dep != "input" and dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def build(runtime, n: int = 8, start: int = 0) -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(documents(n, start), embed_model=TeolaEmbedding(runtime=runtime),
                                           transformations=[splitter()])


def test_deferred_ingestion_runs_in_the_next_querys_graph_with_plain_results(runtime, executor):
    llm = TeolaLLM(runtime=runtime, max_tokens=8)
    plain_index = build(runtime)
    plain = plain_index.as_query_engine(llm=llm, similarity_top_k=3).query(QUESTIONS[0])

    Settings.executor = executor
    teola_index = build(runtime)
    assert pending(teola_index) and not teola_index._vector_store.data.embedding_dict  # nothing embedded yet
    query_engine = teola_index.as_query_engine(llm=llm, similarity_top_k=3)

    graph = executor.trace(query_engine)  # tracing claims nothing
    inserts = [p.name for p in graph.nodes if p.op.value == "vector_insert"]
    embeds = [p.name for p in graph.nodes if p.op.value == "embed"]
    assert len(inserts) == 1 and len(embeds) == 2
    doc_embed = next(e for e in embeds if e in upstream(graph, inserts[0]))
    query_embed = next(e for e in embeds if e != doc_embed)
    assert not upstream(graph, query_embed) & {doc_embed, inserts[0]}  # the query embedding overlaps
    assert inserts[0] in upstream(graph, "vector_search")  # the search sees the documents
    assert pending(teola_index)

    teola = query_engine.query(QUESTIONS[0])
    ops = [s.op for s in runtime.timeline.spans([executor.last_query_id])]
    assert ops.count("embed") >= 2 and "vector_insert" in ops and "vector_search" in ops  # one graph
    assert not pending(teola_index)
    assert [n.node.node_id for n in teola.source_nodes] == [n.node.node_id for n in plain.source_nodes]
    assert [n.score for n in teola.source_nodes] == pytest.approx([n.score for n in plain.source_nodes], abs=1e-5)
    assert teola.response == plain.response
    assert_same_index(teola_index, plain_index)


def test_every_read_path_flushes_pending_ingestion(runtime, executor, tmp_path):
    plain = build(runtime, 3)
    question = QUESTIONS[0]
    want = ids(plain.as_retriever(similarity_top_k=2).retrieve(question))

    Settings.executor = executor
    index = build(runtime, 3)
    retriever = index.as_retriever(similarity_top_k=2)  # built while pending: sees the nodes anyway
    Settings.executor = None  # a retrieve not run by the executor
    assert pending(index) and ids(retriever.retrieve(question)) == want and not pending(index)

    Settings.executor = executor
    index = build(runtime, 3)
    assert len(index.docstore.docs) == len(plain.docstore.docs) and not pending(index)  # docstore access

    index = build(runtime, 3)
    assert list(index.vector_store.data.embedding_dict) == list(plain.vector_store.data.embedding_dict)
    assert not pending(index)

    index = build(runtime, 3)
    executor.flush()
    assert not pending(index) and len(index._vector_store.data.embedding_dict) == len(plain.docstore.docs)

    index = build(runtime, 3)
    index.storage_context.persist(persist_dir=str(tmp_path))
    assert not pending(index) and documents(1)[0].id_ in (tmp_path / "docstore.json").read_text()

    index = build(runtime, 3)
    gone = documents(1)[0].id_
    index.delete_ref_doc(gone, delete_from_docstore=True)  # deletes what was pending, not nothing
    assert not pending(index) and gone not in index.ref_doc_info and len(index.ref_doc_info) == 2
    assert all(gone not in node_id for node_id in index._vector_store.data.embedding_dict)

    index = build(runtime, 3)
    extra = documents(1, start=3)[0]
    index.insert(extra)  # appended after the pending nodes, stored in order
    assert pending(index)
    plain.insert(extra)
    got = ids(index.as_retriever(similarity_top_k=2).retrieve(question))
    Settings.executor = None
    assert got == ids(plain.as_retriever(similarity_top_k=2).retrieve(question))
    assert_same_index(index, plain, min_nodes=3)


def test_a_failed_deferred_ingestion_reaches_the_caller_and_is_retried(runtime, executor, monkeypatch):
    plain = build(runtime, 3)
    want = ids(plain.as_retriever(similarity_top_k=2).retrieve(QUESTIONS[0]))
    Settings.executor = executor
    index = build(runtime, 3)
    retriever = index.as_retriever(similarity_top_k=2)

    def full_disk(self, batch, nodes):
        raise OSError("vector store is full")

    monkeypatch.setattr(Claim, "_store", full_disk)
    with pytest.raises(OSError, match="vector store is full"):
        retriever.retrieve(QUESTIONS[0])
    assert pending(index)  # not dropped
    monkeypatch.undo()
    assert ids(retriever.retrieve(QUESTIONS[0])) == want
    assert not pending(index)
    assert_same_index(index, plain, min_nodes=3)


def test_a_query_that_fails_after_claiming_gives_the_nodes_back(runtime, executor, monkeypatch):
    """Claims are taken at plan time: a failure before the run starts (here the optimizer)
    must not leave them held, or every later access would wait for them and time out."""
    plain = build(runtime, 3)
    want = ids(plain.as_retriever(similarity_top_k=2).retrieve(QUESTIONS[0]))
    Settings.executor = executor
    index = build(runtime, 3)
    retriever = index.as_retriever(similarity_top_k=2)

    def broken_optimizer(graph):
        raise RuntimeError("optimizer broke")

    monkeypatch.setattr(executor, "_prepare", broken_optimizer)
    with pytest.raises(RuntimeError, match="optimizer broke"):
        retriever.retrieve(QUESTIONS[0])
    monkeypatch.undo()
    state = PendingIngestion.of(index)
    assert state is not None and state.has_work() and state.claim is None  # pending, and free
    assert ids(retriever.retrieve(QUESTIONS[0])) == want
    assert not pending(index)


def test_shards_are_stored_in_node_order_and_an_abandoned_run_leaves_the_rest_pending(monkeypatch):
    """Pure logic of a claim: vectors arrive by shard in any order; only the ready prefix is
    stored (LlamaIndex's insertion order), and what is not stored goes back to pending."""
    from types import SimpleNamespace

    from llama_index.core.schema import TextNode

    from teola_plugin.capture import llama_index_ingest as ingest

    stored: list[list[str]] = []
    monkeypatch.setattr(ingest, "_ADD_NODES", lambda index, struct, nodes, **kw: stored.append(
        [f"{n.node_id}:{n.embedding[0]:g}" for n in nodes]))
    index = SimpleNamespace(_index_struct=None, __dict__={})
    state = PendingIngestion(index)
    nodes = [TextNode(id_=f"n{i}", text=f"t{i}") for i in range(6)]
    state.add(ingest.PendingBatch("struct", nodes[:4]))
    state.add(ingest.PendingBatch("struct", nodes[4:]))

    try:
        claim = state.try_claim(list(state.batches))
        claim.receive([2, 3], [[2.0], [3.0]])  # the second shard first: nothing may be stored yet
        assert stored == []
        claim.receive([0, 1], [[0.0], [1.0]])
        assert stored == [["n0:0", "n1:1", "n2:2", "n3:3"]]
        claim.release()  # the run failed before the last shard
        assert [n.node_id for b in state.batches for n in b.nodes] == ["n4", "n5"] and state.claim is None
        with pytest.raises(RuntimeError, match="abandoned"):
            claim.receive([4, 5], [[4.0], [5.0]])  # a late shard of the failed run stores nothing
        assert stored == [["n0:0", "n1:1", "n2:2", "n3:3"]]
    finally:  # this stub index must not reach a later flush
        state.batches.clear()
        ingest._unregister(state)
        assert state not in ingest.pending_states()
