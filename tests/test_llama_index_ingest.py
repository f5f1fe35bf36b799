"""Index building under TeolaExecutor.

Eager (``defer_ingestion=False``): ``VectorStoreIndex.from_documents`` / ``insert`` embed
their nodes through one Teola query on the embedder engine. Deferred (default): the nodes
are recorded and the next query on the index embeds and inserts them in its own graph;
every other read path flushes first. Either way the index must end up with the very nodes,
ids and embeddings plain LlamaIndex stores (a deterministic ``id_func`` makes the node ids
comparable; embeddings are compared to 1e-5 since the engine batches texts differently).
"""

from __future__ import annotations

import json

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from teola_plugin import datasets
from teola_plugin.llama_index.pending_ingestion import Claim, PendingIngestion
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

    # the storage context's own stores, read directly (LlamaIndex's BM25 example builds its
    # retriever from the docstore so): their reads go through the key-value store underneath
    docstore_reads = (lambda i: sorted(i.storage_context.docstore.docs),
                      lambda i: i.storage_context.docstore.document_exists(next(iter(plain.docstore.docs))),
                      lambda i: sorted(i.storage_context.docstore.get_all_ref_doc_info()),
                      lambda i: sorted(i.storage_context.to_dict()["doc_store"]["docstore/data"]),
                      lambda i: sorted(i.storage_context.vector_store.to_dict()["embedding_dict"]),
                      lambda i: [s.index_id for s in i.storage_context.index_store.index_structs()]
                      and len(i.storage_context.index_store.get_index_struct(i.index_id).nodes_dict))
    docstore_reads += (lambda i: sorted(i.ref_doc_info),  # alone: it reads index_struct before the docstore
                       lambda i: sorted(i.index_struct.nodes_dict.values()),  # the struct itself
                       lambda i: len(json.loads(i.index_struct.to_json())["nodes_dict"]))
    for read in docstore_reads:
        index = build(runtime, 3)
        assert pending(index) and read(index) == read(plain) and read(plain) and not pending(index)
    from llama_index.retrievers.bm25 import BM25Retriever

    index = build(runtime, 3)
    bm25 = BM25Retriever.from_defaults(docstore=index.storage_context.docstore, similarity_top_k=2)
    assert not pending(index)
    assert ids(bm25.retrieve(question)) == ids(
        BM25Retriever.from_defaults(docstore=plain.storage_context.docstore, similarity_top_k=2).retrieve(question))

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


def test_an_index_with_pending_nodes_copies_and_pickles_as_plains(runtime, executor):
    """``copy.deepcopy`` / ``pickle`` of an index (and of its storage context's vector store)
    hold every node plain's would, pending ones included (they are stored first); Teola keeps
    nothing on the index itself, so it copies and pickles after the executor is gone too."""
    import copy
    import gc
    import pickle
    import weakref

    plain = build(runtime, 3)
    Settings.executor = executor
    for clone in (copy.deepcopy, lambda i: pickle.loads(pickle.dumps(i))):
        index = build(runtime, 3)
        assert pending(index)
        copied = clone(index)
        assert not pending(index) and not pending(copied)
        assert_same_index(copied, plain, min_nodes=3)
    index = build(runtime, 3)
    store = pickle.loads(pickle.dumps(index.storage_context.vector_store))
    assert not pending(index) and list(store.data.embedding_dict) == list(plain.vector_store.data.embedding_dict)
    Settings.executor = None
    assert_same_index(pickle.loads(pickle.dumps(index)), plain, min_nodes=3)
    # an index nobody holds any more goes (its state with it) once nothing is pending
    gone = weakref.ref(index)
    del index, copied
    gc.collect()
    assert gone() is None


def test_nodes_changed_after_their_index_call_returned_are_stored_as_they_were(runtime, executor):
    """Plain embeds and stores the nodes during ``VectorStoreIndex(nodes)`` / ``insert_nodes``
    (copies, the docstore's JSON): the caller editing its node objects afterwards (reusing the
    list for another index) changes nothing stored, deferred or not."""
    def nodes(start: int) -> list:
        return splitter().get_nodes_from_documents(documents(3, start))

    def edit(batch: list) -> None:
        batch[0].text = "The Eiffel Tower is in Berlin."
        for node in batch:
            node.metadata["title"] = "edited"
            node.excluded_embed_metadata_keys = ["title"]

    def built() -> VectorStoreIndex:
        first = nodes(0)
        index = VectorStoreIndex(first, embed_model=TeolaEmbedding(runtime=runtime))
        edit(first)
        later = nodes(3)
        index.insert_nodes(later)
        edit(later)
        return index

    plain = built()
    Settings.executor = executor
    index = built()
    assert pending(index)
    hits = index.as_retriever(similarity_top_k=3).retrieve(QUESTIONS[0])
    Settings.executor = None
    assert ids(hits) == ids(plain.as_retriever(similarity_top_k=3).retrieve(QUESTIONS[0]))
    assert_same_index(index, plain, min_nodes=6)
    for node_id, node in plain.docstore.docs.items():
        assert index.docstore.get_node(node_id).to_dict() == node.to_dict() and node.metadata["title"] != "edited"


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

    def broken_optimizer(graph, engines=None):
        raise RuntimeError("optimizer broke")

    monkeypatch.setattr(executor, "_prepare", broken_optimizer)
    with pytest.raises(RuntimeError, match="optimizer broke"):
        retriever.retrieve(QUESTIONS[0])
    monkeypatch.undo()
    state = PendingIngestion.of(index)
    assert state is not None and state.has_work() and state.claim is None  # pending, and free
    assert ids(retriever.retrieve(QUESTIONS[0])) == want
    assert not pending(index)


class StubIndex:
    """An index's stand-in for the pure logic of pending batches (weakly referenced, as an index is)."""

    def __init__(self, **attrs) -> None:
        self.__dict__.update(attrs)


def test_shards_are_stored_in_node_order_and_an_abandoned_run_leaves_the_rest_pending(monkeypatch):
    """Pure logic of a claim: vectors arrive by shard in any order; only the ready prefix is
    stored (LlamaIndex's insertion order), and what is not stored goes back to pending."""
    from llama_index.core.schema import TextNode

    from teola_plugin.llama_index import pending_ingestion as ingest

    stored: list[list[str]] = []
    monkeypatch.setattr(ingest, "_ADD_NODES", lambda index, struct, nodes, **kw: stored.append(
        [f"{n.node_id}:{n.embedding[0]:g}" for n in nodes]))
    index = StubIndex(_index_struct=None)
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


# -- claim routing: by join id, never by index name -----------------------------------------------
def stub_pending(ingest, label: str, ids: range) -> PendingIngestion:
    """A pending stub index (never a real store) whose nodes are ``<label><i>``."""
    from llama_index.core.schema import TextNode

    index = StubIndex(_index_struct=None, label=label)  # held by its state while its nodes are pending
    state = PendingIngestion.of(index, create=True)
    state.add(ingest.PendingBatch("struct", [TextNode(id_=f"{label}{i}", text=f"t{i}") for i in ids]))
    return state


def insert_request(join_id: str, positions: list[int]) -> dict:
    import numpy as np

    # Every join inserts through the same index name here: only the join id tells them apart.
    return {"index": "retriever-shared", "ids": [str(p) for p in positions],
            "vectors": np.full((len(positions), 2), float(positions[0])), "texts": [""] * len(positions),
            "metadatas": [{"claim": join_id}] * len(positions)}


def test_the_store_engine_routes_each_insert_to_the_claim_its_join_names(monkeypatch):
    """Pure logic (no engine): two claims live on one engine at once each get their own
    inserts; an abandoned run's late insert reaches neither its successor's claim nor the
    store; an unknown join id is an input error naming it."""
    import asyncio

    from teola_plugin.llama_index import pending_ingestion as ingest
    from teola_plugin.engines.llama_index_store import LlamaIndexStoreEngine
    from teola_plugin.errors import EngineInputError

    stored: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(ingest, "_ADD_NODES", lambda index, struct, nodes, **kw: stored.append(
        (index.label, [n.node_id for n in nodes])))
    insert = lambda *requests: asyncio.run(engine.batch_insert(list(requests)))  # noqa: E731
    a, b = stub_pending(ingest, "a", range(2)), stub_pending(ingest, "b", range(3))
    engine = LlamaIndexStoreEngine(object(), name="store")
    try:
        claim_a, claim_b = a.try_claim(list(a.batches)), b.try_claim(list(b.batches))
        engine.expect("join-a", claim_a)
        engine.expect("join-b", claim_b)
        insert(insert_request("join-b", [1, 2]), insert_request("join-a", [0, 1]), insert_request("join-b", [0]))
        assert stored == [("a", ["a0", "a1"]), ("b", ["b0", "b1", "b2"])]
        assert a.claim is None is b.claim and not a.batches and not b.batches
        with pytest.raises(RuntimeError, match="already routes"):
            engine.expect("join-a", claim_b)  # one join, one claim

        # A run whose caller gave up, and the next run claiming the same nodes: the old run's
        # late insert must not land in the new claim (whose positions are its own).
        stored.clear()
        a = stub_pending(ingest, "a", range(2, 4))
        old = a.try_claim(list(a.batches))
        engine.expect("join-old", old)
        old.release()
        new = a.try_claim(list(a.batches))
        engine.expect("join-new", new)
        with pytest.raises(RuntimeError, match="abandoned"):
            insert(insert_request("join-old", [0, 1]))
        engine.forget("join-old", new)  # not its claim: the route stays
        engine.forget("join-old", old)
        with pytest.raises(EngineInputError, match="no pending ingestion for join 'join-old'"):
            insert(insert_request("join-old", [0]))
        with pytest.raises(EngineInputError, match="join-nobody"):  # checked before anything is stored
            insert(insert_request("join-new", [0]), insert_request("join-nobody", [0]))
        assert stored == [] and a.claim is new
        insert(insert_request("join-new", [1]), insert_request("join-new", [0]))
        assert stored == [("a", ["a2", "a3"])] and a.claim is None
    finally:  # these stub indexes must not reach a later flush
        for state in (a, b):
            state.batches.clear()
            ingest._unregister(state)


def test_concurrent_queries_each_insert_their_own_pending_nodes_once(runtime, executor, monkeypatch):
    """Two queries at once (asyncio.gather): a fusion over two indexes sharing one vector
    store (two joins on one store engine in one graph) and a query engine on a third index.
    Every node is stored by its own query's graph, into its own index, exactly once, and
    the results are plain LlamaIndex's."""
    import asyncio
    from collections import Counter

    from llama_index.core import StorageContext
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.vector_stores import SimpleVectorStore

    from teola_plugin.llama_index import pending_ingestion as ingest

    llm = TeolaLLM(runtime=runtime, max_tokens=8)

    def indexes() -> list[VectorStoreIndex]:
        shared = SimpleVectorStore()
        return [VectorStoreIndex.from_documents(
            documents(3, start), embed_model=TeolaEmbedding(runtime=runtime), transformations=[splitter()],
            storage_context=StorageContext.from_defaults(vector_store=store))
            for start, store in ((0, shared), (3, shared), (6, SimpleVectorStore()))]

    def apps(a, b, c):
        fusion = QueryFusionRetriever([a.as_retriever(similarity_top_k=2), b.as_retriever(similarity_top_k=2)],
                                      llm=llm, num_queries=1, similarity_top_k=3, use_async=False)
        return fusion, c.as_query_engine(llm=llm, similarity_top_k=2)

    questions = QUESTIONS[0], QUESTIONS[2]
    plain_indexes = indexes()
    plain_fusion, plain_engine = apps(*plain_indexes)
    plain_nodes, plain_answer = plain_fusion.retrieve(questions[0]), plain_engine.query(questions[1])

    Settings.executor = executor
    teola_indexes = indexes()
    assert all(pending(i) for i in teola_indexes)
    owner = {id(i): k for k, i in enumerate(teola_indexes)}
    stored: Counter = Counter()
    by_graph: set[str] = set()
    add_nodes, store = ingest._ADD_NODES, Claim._store

    def recording_add_nodes(index, struct, nodes, **kwargs):
        stored.update((owner.get(id(index)), n.node_id) for n in nodes)
        return add_nodes(index, struct, nodes, **kwargs)

    def recording_store(self, batch, nodes):
        by_graph.update(n.node_id for n in nodes)
        return store(self, batch, nodes)

    monkeypatch.setattr(ingest, "_ADD_NODES", recording_add_nodes)
    monkeypatch.setattr(Claim, "_store", recording_store)
    fusion, query_engine = apps(*teola_indexes)

    async def both():
        return await asyncio.gather(executor.aretrieve(fusion, questions[0]),
                                    executor.aquery(query_engine, questions[1]))

    nodes, answer = asyncio.run(both())
    assert not any(pending(i) for i in teola_indexes)
    want = Counter((k, node_id) for k, i in enumerate(plain_indexes) for node_id in i.index_struct.nodes_dict)
    assert stored == want and set(stored.values()) == {1}  # each node once, into its own index
    assert by_graph == {node_id for _, node_id in want}  # all by the queries' graphs (none flushed)
    for teola, plain in zip(teola_indexes, plain_indexes):
        assert sorted(teola.docstore.docs) == sorted(plain.docstore.docs)
        assert teola.index_struct.nodes_dict == plain.index_struct.nodes_dict
    for store_of in (0, 2):  # the shared store and the third one
        got = teola_indexes[store_of].vector_store.data.embedding_dict
        expected = plain_indexes[store_of].vector_store.data.embedding_dict
        assert sorted(got) == sorted(expected)  # (the shared store's order is whichever insert came first)
        for node_id, vector in expected.items():
            assert got[node_id] == pytest.approx(vector, abs=1e-5)
    assert ids(nodes) == ids(plain_nodes) and len(plain_nodes) == 3
    assert [n.score for n in nodes] == pytest.approx([n.score for n in plain_nodes], abs=1e-5)
    assert ids(answer.source_nodes) == ids(plain_answer.source_nodes)
    assert answer.response == plain_answer.response  # one LLM call in flight: no batching with another


def test_an_ingestion_pipeline_embeds_on_the_embedder_engine_with_plains_result(runtime):
    """``IngestionPipeline([splitter, HuggingFaceEmbedding])`` as the docs load documents: its
    embedding transformation is LlamaIndex's own code, and under ``Settings.executor`` its
    model's calls go to the embedder engine (the same model): the same nodes, the same
    vectors (1e-5), sync and async."""
    import asyncio

    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.engines.embedder import default_model_path

    model = HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu")
    docs = documents(6)

    def pipeline() -> IngestionPipeline:
        return IngestionPipeline(transformations=[splitter(), model])

    def batches() -> int:
        return sum(s["batches_run"] for s in runtime.run_sync(runtime.engines("embedder").stats()))

    plain = pipeline().run(documents=docs)
    runtime.run_sync(runtime.start_engines("embedder"))
    Settings.executor = TeolaExecutor(runtime=runtime, start_engines=False)
    try:
        before = batches()
        teola = pipeline().run(documents=docs)
        after_sync = batches()
        ateola = asyncio.run(pipeline().arun(documents=docs))
    finally:
        Settings.executor = None
    assert after_sync > before and batches() > after_sync  # both runs embedded on the engine
    assert len(plain) > 6
    for nodes in (teola, ateola):
        assert [(n.node_id, n.get_content()) for n in nodes] == [(n.node_id, n.get_content()) for n in plain]
        for got, want in zip(nodes, plain):
            assert got.embedding == pytest.approx(want.embedding, abs=1e-5)
