"""The vector stores users run, searched in place: FAISS, Qdrant (local mode), Milvus Lite (the
store vLLM's LangChain RAG example uses) and a Chroma server (``chroma run``, started here,
reached with ``chromadb.HttpClient``), LangChain and LlamaIndex (Milvus: LangChain only, see
``capture/llama_index_rules.py``), each on its real library (no server mocked).

A lowered retriever embeds the query on the embedder engine and calls the user's own store's
search by vector with the retriever's arguments (LangChain: similarity with a metadata
filter, MMR; LlamaIndex: the retriever's own query path), so it must return plain's documents,
in plain's order, with nothing opaque. Chroma in-process and the in-memory stores are covered
by the LangChain / LlamaIndex test files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from langchain_core.documents import Document

from teola_plugin import datasets
from teola_plugin.engines.embedder import default_model_path
from tests.fixtures_served import free_port

pytestmark = pytest.mark.slow

QUESTIONS = [q.question for q in datasets.load_questions("squad-xquad-en", limit=40)[::13]]
PASSAGES = [p.text for p in datasets.load_corpus("squad-xquad-en")[:16]]


@pytest.fixture(scope="module")
def chroma_server(tmp_path_factory):
    """``chroma run`` on loopback (the CLI chromadb installs); yields an ``HttpClient`` factory."""
    import chromadb

    port = free_port()
    log = tmp_path_factory.mktemp("chroma") / "server.log"
    cli = Path(sys.executable).with_name("chroma")  # beside the interpreter: `make test` leaves the venv off PATH
    command = [str(cli) if cli.exists() else shutil.which("chroma") or "chroma", "run",
               "--path", str(log.parent / "db"), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                chromadb.HttpClient(host="127.0.0.1", port=port).heartbeat()
                break
            except Exception:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chroma run did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.3)
        yield lambda: chromadb.HttpClient(host="127.0.0.1", port=port)
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="module")
def documents():
    return [Document(page_content=text, metadata={"topic": i % 2, "n": i}) for i, text in enumerate(PASSAGES)]


@pytest.fixture(scope="module")
def hf_embeddings():
    from langchain_huggingface import HuggingFaceEmbeddings

    return HuggingFaceEmbeddings(model_name=str(default_model_path()))


def langchain_store(kind: str, documents, embeddings, chroma_server, tmp_path):
    if kind == "milvus-lite":
        from langchain_milvus import Milvus

        store = Milvus.from_documents(documents, embeddings, connection_args={"uri": str(tmp_path / "milvus.db")},
                                      collection_name="squad")
        return store, "topic == 0"
    if kind == "chroma-server":
        from langchain_chroma import Chroma

        store = Chroma(client=chroma_server(), collection_name="squad_langchain", embedding_function=embeddings)
        store.add_documents(documents)
        return store, {"topic": 0}
    if kind == "faiss":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # langchain-community's sunset notice
            from langchain_community.vectorstores import FAISS
        return FAISS.from_documents(documents, embeddings), {"topic": 0}
    from langchain_qdrant import QdrantVectorStore
    from qdrant_client import models

    store = QdrantVectorStore.from_documents(documents, embeddings, location=":memory:", collection_name="squad")
    topic0 = models.Filter(must=[models.FieldCondition(key="metadata.topic", match=models.MatchValue(value=0))])
    return store, topic0


@pytest.mark.parametrize("kind", ["faiss", "qdrant", "milvus-lite", "chroma-server"])
def test_langchain_stores_users_run_are_searched_in_place(kind, documents, hf_embeddings, runtime, chroma_server,
                                                           tmp_path):
    from teola_plugin.langchain import TeolaRunnable

    store, topic0 = langchain_store(kind, documents, hf_embeddings, chroma_server, tmp_path)
    by_topic = "expr" if kind == "milvus-lite" else "filter"  # Milvus filters with a boolean expression
    for search in ({"search_kwargs": {"k": 3}},
                   {"search_kwargs": {"k": 3, by_topic: topic0}},
                   {"search_type": "mmr", "search_kwargs": {"k": 2, "fetch_k": 6}}):
        retriever = store.as_retriever(**search)
        teola = TeolaRunnable(retriever, runtime=runtime)
        ops = {p.op.value: p.engine for p in teola.trace(QUESTIONS[0]).nodes}
        assert ops["embed"] == "embedder" and ops["vector_search"].startswith("langchain_store_"), ops
        assert teola._plan(QUESTIONS[0]).trace.opaque == []
        for question in QUESTIONS[:2]:
            plain = retriever.invoke(question)
            assert teola.invoke(question) == plain and plain, search
        if by_topic in search["search_kwargs"]:
            assert {d.metadata["topic"] for d in plain} == {0}
    # a relevance-score search (the store's relevance function on its scored search by vector),
    # with a threshold between the top scores: it keeps some documents and drops others
    scores = [s for _, s in store.similarity_search_with_relevance_scores(QUESTIONS[0], k=3)]
    retriever = store.as_retriever(search_type="similarity_score_threshold",
                                   search_kwargs={"k": 3, "score_threshold": float(scores[0] + scores[-1]) / 2})
    teola = TeolaRunnable(retriever, runtime=runtime)
    assert teola._plan(QUESTIONS[0]).trace.opaque == []
    plain = retriever.invoke(QUESTIONS[0])
    assert teola.invoke(QUESTIONS[0]) == plain and 0 < len(plain) < 3, scores


def test_langchain_qdrants_sparse_modes_stay_its_own(documents, hf_embeddings, runtime):
    from langchain_qdrant import QdrantVectorStore, RetrievalMode

    from teola_plugin.langchain import TeolaRunnable

    store = QdrantVectorStore.from_documents(documents[:2], hf_embeddings, location=":memory:", collection_name="q")
    store.retrieval_mode = RetrievalMode.HYBRID  # (as if built so: its text search embeds sparse too)
    (note,) = TeolaRunnable(store.as_retriever(), runtime=runtime)._plan("q").trace.opaque
    assert "retrieval_mode 'hybrid'" in note.reason


def llama_index_store(kind: str, chroma_server):
    if kind == "simple":
        from llama_index.core.vector_stores import SimpleVectorStore

        return SimpleVectorStore()
    if kind == "chroma-server":
        from llama_index.vector_stores.chroma import ChromaVectorStore

        return ChromaVectorStore(chroma_collection=chroma_server().get_or_create_collection("squad_llama_index"))
    if kind == "faiss":
        import faiss
        from llama_index.vector_stores.faiss import FaissVectorStore

        return FaissVectorStore(faiss_index=faiss.IndexFlatL2(384))
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    return QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="squad")


@pytest.mark.parametrize("kind", ["simple", "faiss", "qdrant", "chroma-server"])
def test_llama_index_stores_users_run_are_searched_in_place(kind, runtime, chroma_server):
    """Each store searched by the retriever's own query, in the default mode and in MMR mode
    (``as_retriever(vector_store_query_mode="mmr", vector_store_kwargs={"mmr_threshold": ...})``,
    LlamaIndex's MMR example): the same nodes, in the same order, with the same scores."""
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core import Document as LlamaDocument
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from teola_plugin.llama_index import TeolaExecutor

    storage = StorageContext.from_defaults(vector_store=llama_index_store(kind, chroma_server))
    index = VectorStoreIndex.from_documents([LlamaDocument(text=t, id_=str(i)) for i, t in enumerate(PASSAGES)],
                                            storage_context=storage,
                                            embed_model=HuggingFaceEmbedding(model_name=str(default_model_path())))
    executor = TeolaExecutor(runtime=runtime)
    mmr = {"vector_store_query_mode": "mmr", "vector_store_kwargs": {"mmr_threshold": 0.3}}
    differs = []
    for retriever in (index.as_retriever(similarity_top_k=3), index.as_retriever(similarity_top_k=3, **mmr)):
        app = executor.traced(retriever)
        assert app.opaque == [], [str(n) for n in app.opaque]
        assert {p.op.value for p in app.graph.nodes} >= {"embed", "vector_search"}
        for question in QUESTIONS[:2]:
            plain = retriever.retrieve(question)
            teola = executor.retrieve(retriever, question)
            assert [n.node.node_id for n in teola] == [n.node.node_id for n in plain] and plain
            assert [n.node.get_content() for n in teola] == [n.node.get_content() for n in plain]
            assert [n.score for n in teola] == pytest.approx([n.score for n in plain], abs=1e-4)
            differs.append([n.node.node_id for n in plain])
    if kind in ("simple", "chroma-server"):  # stores with an MMR search of their own: it chose otherwise
        assert differs[:2] != differs[2:]


def test_a_llama_index_qdrant_store_answers_an_async_retrieve_with_its_async_client_as_plain(runtime):
    """Qdrant's ``aquery`` is its own (the ``AsyncQdrantClient``): plain's ``aretrieve`` /
    ``aquery`` search with it, so a lowered async search does too, on the caller's loop. With
    both clients, LlamaIndex's async demo: plain's nodes; with only an async client (the sync
    path would fail: no client); with only a sync client, plain's own error."""
    import asyncio

    import qdrant_client
    from llama_index.core import Document as LlamaDocument
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.qdrant import QdrantVectorStore

    from teola_plugin.llama_index import TeolaExecutor

    embed = HuggingFaceEmbedding(model_name=str(default_model_path()))
    documents = [LlamaDocument(text=t, id_=str(i)) for i, t in enumerate(PASSAGES[:6])]
    executor = TeolaExecutor(runtime=runtime)

    async def build(name: str, **clients):
        store = QdrantVectorStore(collection_name=name, **clients)
        index = VectorStoreIndex(nodes=[], storage_context=StorageContext.from_defaults(vector_store=store),
                                 embed_model=embed, use_async=True)
        for document in documents:
            await index.ainsert(document)
        return index.as_retriever(similarity_top_k=2)

    async def both(retriever):
        try:
            plain = await retriever.aretrieve(QUESTIONS[0])
        except ValueError as exc:
            with pytest.raises(ValueError, match=re.escape(str(exc))):
                await executor.aretrieve(retriever, QUESTIONS[0])
            return str(exc).splitlines()[0]
        teola = await executor.aretrieve(retriever, QUESTIONS[0])
        assert executor.traced(retriever).opaque == []
        assert [(n.node.node_id, round(n.score, 4)) for n in teola] == [(n.node.node_id, round(n.score, 4))
                                                                        for n in plain]
        return "same nodes"

    async def cases():
        async_only = await build("a", aclient=qdrant_client.AsyncQdrantClient(location=":memory:"))
        pair = await build("b", client=qdrant_client.QdrantClient(location=":memory:"),
                           aclient=qdrant_client.AsyncQdrantClient(location=":memory:"))
        return [await both(async_only), await both(pair)]

    assert asyncio.run(cases()) == ["same nodes", "same nodes"]

    # only a sync client: plain's aretrieve raises; so does Teola's
    store = QdrantVectorStore(client=qdrant_client.QdrantClient(location=":memory:"), collection_name="s")
    index = VectorStoreIndex.from_documents(documents, storage_context=StorageContext.from_defaults(vector_store=store),
                                            embed_model=embed)
    assert asyncio.run(both(index.as_retriever(similarity_top_k=2))) == "Async client is not initialized!"
