"""Index building under TeolaExecutor.

With the executor installed, ``VectorStoreIndex.from_documents`` / ``insert`` embed their
nodes through one Teola query on the embedder engine; the index must end up with the very
nodes, ids and embeddings plain LlamaIndex stores (a deterministic ``id_func`` makes the
node ids comparable; embeddings are compared to 1e-5 since the engine batches texts
differently).
"""

from __future__ import annotations

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from teola_plugin import datasets
from teola_plugin.llama_index import TeolaEmbedding
from tests.test_llama_index import QUESTIONS, executor, ids, plain_settings  # noqa: F401

pytestmark = pytest.mark.slow


def documents(n: int, start: int = 0) -> list[Document]:
    return [Document(text=p.text, metadata={"title": p.title}, id_=p.id)
            for p in datasets.load_corpus("squad-xquad-en")[start:start + n]]


def splitter() -> SentenceSplitter:
    return SentenceSplitter(chunk_size=96, chunk_overlap=0, id_func=lambda i, doc: f"{doc.id_}#{i}")


def assert_same_index(teola: VectorStoreIndex, plain: VectorStoreIndex) -> None:
    assert sorted(teola.docstore.docs) == sorted(plain.docstore.docs)
    assert teola.ref_doc_info.keys() == plain.ref_doc_info.keys()
    got, want = teola.vector_store.data.embedding_dict, plain.vector_store.data.embedding_dict
    assert list(got) == list(want) and len(want) > 12  # the same nodes, in the same order
    for node_id, vector in want.items():
        assert got[node_id] == pytest.approx(vector, abs=1e-5)


def test_from_documents_and_insert_embed_on_teola_with_the_same_result(runtime, executor):
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
