"""Progress bars on long work: LlamaIndex's ``show_progress`` under TeolaExecutor, model conversion.

Plain LlamaIndex prints a tqdm bar "Generating embeddings" (stderr) when
``from_documents(..., show_progress=True)`` embeds; under the executor the embedding runs in
the next query's graph (deferred) or as a Teola query (eager, flush), and the bar must still
reach the node count there, and stay off when ``show_progress`` is False (the default).
"""

from __future__ import annotations

import re

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from teola_plugin import datasets
from teola_plugin.llama_index.pending_ingestion import PendingIngestion
from teola_plugin.capture.llama_index_progress import DESCRIPTION, NodeProgress
from teola_plugin.llama_index import TeolaEmbedding, TeolaExecutor, TeolaLLM
from tests.test_llama_index import QUESTIONS, executor, ids, plain_settings  # noqa: F401

BAR = re.compile(re.escape(DESCRIPTION) + r": +100%\|[^|]*\| (\d+)/(\d+)")


def finished_bars(text: str) -> list[int]:
    """Totals of the bars closed at 100% (n == total) in captured stderr: a closed bar's last
    render (after the last carriage return) ends its line."""
    done = [BAR.match(line.split("\r")[-1].strip()) for line in text.split("\n")]
    pairs = [(int(m[1]), int(m[2])) for m in done if m]
    assert all(n == total for n, total in pairs), pairs
    return [total for _, total in pairs]


def documents(n: int, start: int = 0) -> list[Document]:
    return [Document(text=p.text, metadata={"title": p.title}, id_=p.id)
            for p in datasets.load_corpus("squad-xquad-en")[start:start + n]]


def build(runtime, n: int = 3, start: int = 0, show_progress: bool = False, **kwargs) -> VectorStoreIndex:
    splitter = SentenceSplitter(chunk_size=96, chunk_overlap=0, id_func=lambda i, doc: f"{doc.id_}#{i}")
    return VectorStoreIndex.from_documents(documents(n, start), embed_model=TeolaEmbedding(runtime=runtime),
                                           transformations=[splitter], show_progress=show_progress, **kwargs)


# -- pure logic ----------------------------------------------------------------------------------
def test_node_progress_counts_only_batches_that_asked_and_each_node_once(capsys):
    from types import SimpleNamespace

    batches = [SimpleNamespace(nodes=[0] * 3, show_progress=False), SimpleNamespace(nodes=[0] * 4, show_progress=True)]
    progress = NodeProgress.for_batches(batches)  # positions 3..6 are shown
    progress.advance([0, 1, 2])  # a batch without show_progress: not counted
    assert progress._bar.n == 0
    progress.advance([4, 3])
    progress.advance([3, 4])  # delivered twice: counted once
    assert progress._bar.n == 2
    progress.advance([5, 6])
    assert progress._bar.n == 4
    progress.close()
    progress.close()  # idempotent
    assert finished_bars(capsys.readouterr().err) == [4]

    quiet = NodeProgress.for_batches([SimpleNamespace(nodes=[0] * 5, show_progress=False)])
    quiet.advance(range(5))
    quiet.close()
    assert not quiet.shown and DESCRIPTION not in capsys.readouterr().err


def test_a_claims_bar_advances_per_shard_and_closes_when_all_are_stored(monkeypatch, capsys):
    from llama_index.core.schema import TextNode

    from teola_plugin.llama_index import pending_ingestion as ingest
    from tests.test_llama_index_ingest import StubIndex

    monkeypatch.setattr(ingest, "_ADD_NODES", lambda index, struct, nodes, **kw: None)
    index = StubIndex(_index_struct=None)
    state = PendingIngestion(index)
    nodes = [TextNode(id_=f"n{i}", text=f"t{i}") for i in range(6)]
    state.add(ingest.PendingBatch("struct", nodes, show_progress=True))
    try:
        claim = state.try_claim(list(state.batches))
        claim.receive([3, 4, 5], [[3.0], [4.0], [5.0]])  # a later shard first: counted as embedded
        assert claim.progress._bar.n == 3 and DESCRIPTION in capsys.readouterr().err
        claim.receive([0, 1, 2], [[0.0], [1.0], [2.0]])
        assert claim.finished and not claim.progress.shown  # closed with the insert
        assert finished_bars(capsys.readouterr().err) == [6]
    finally:  # this stub index must not reach a later flush
        state.batches.clear()
        ingest._unregister(state)


# -- on the real engines -------------------------------------------------------------------------
@pytest.mark.slow
def test_deferred_ingestion_shows_the_embedding_bar_in_the_querys_graph(runtime, executor, capsys):
    build(runtime, show_progress=True)  # plain LlamaIndex with TeolaEmbedding: its own bar
    plain_totals = finished_bars(capsys.readouterr().err)
    assert len(plain_totals) == 1 and plain_totals[0] > 3  # several nodes per document

    llm = TeolaLLM(runtime=runtime, max_tokens=8)
    Settings.executor = executor
    shown = build(runtime, show_progress=True)
    assert DESCRIPTION not in capsys.readouterr().err  # deferred: nothing embedded yet
    with_bar = shown.as_query_engine(llm=llm, similarity_top_k=2).query(QUESTIONS[0])
    assert "vector_insert" in [s.op for s in runtime.timeline.spans([executor.last_query_id])]  # in the graph
    n_nodes = len(shown._vector_store.data.embedding_dict)
    assert finished_bars(capsys.readouterr().err) == [n_nodes] == plain_totals

    quiet = build(runtime, show_progress=False)  # LlamaIndex's default
    without_bar = quiet.as_query_engine(llm=llm, similarity_top_k=2).query(QUESTIONS[0])
    assert "vector_insert" in [s.op for s in runtime.timeline.spans([executor.last_query_id])]
    assert DESCRIPTION not in capsys.readouterr().err
    assert ids(with_bar.source_nodes) == ids(without_bar.source_nodes)
    assert with_bar.response == without_bar.response


@pytest.mark.slow
def test_call_time_embedding_shows_the_bar_when_asked(runtime, executor, capsys):
    Settings.executor = TeolaExecutor(runtime=runtime, defer_ingestion=False)
    index = build(runtime, n=2, show_progress=True)  # embedded now, as one Teola query
    assert finished_bars(capsys.readouterr().err) == [len(index._vector_store.data.embedding_dict)]
    build(runtime, n=2)
    assert DESCRIPTION not in capsys.readouterr().err
    index = build(runtime, n=1, start=6, show_progress=True, use_async=True)  # the async embedding step
    assert finished_bars(capsys.readouterr().err) == [len(index._vector_store.data.embedding_dict)]

    Settings.executor = executor  # deferred, then stored by a flush (one Teola query)
    index = build(runtime, n=2, start=2, show_progress=True)
    executor.flush()
    assert executor.last_query_id.startswith("li-ingest")
    assert finished_bars(capsys.readouterr().err) == [len(index._vector_store.data.embedding_dict)]

    index.insert(documents(1, start=4)[0])  # LlamaIndex's insert passes no show_progress to embedding
    executor.flush()
    assert DESCRIPTION not in capsys.readouterr().err

    splitter = SentenceSplitter(chunk_size=96, chunk_overlap=0)
    nodes = splitter.get_nodes_from_documents(documents(1, start=5))
    index.insert_nodes(nodes, show_progress=True)  # as plain LlamaIndex: a bar over these nodes
    assert PendingIngestion.of(index).has_work()
    executor.flush()
    assert finished_bars(capsys.readouterr().err) == [len(nodes)]
