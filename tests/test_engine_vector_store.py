"""ChromaVectorStore on embedded chromadb: ANN recall against exact search, all-or-nothing
writes, persistence, isolation, and the batched entry points."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from teola_plugin import datasets
from teola_plugin.engines import ChromaVectorStore, Hit
from teola_plugin.errors import EngineInputError

DIM = 8


def _unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _fill(aio, vs, n=5, name="docs", seed=0):
    vecs = _unit(np.random.default_rng(seed), n)
    aio.run(vs.create_index(name, DIM))
    aio.run(vs.insert(name, [f"d{i}" for i in range(n)], vecs, [f"text {i}" for i in range(n)],
                      [{"i": i} for i in range(n)]))
    return vecs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squad-xquad-en", "hotpotqa-dev-500"])
def test_recall_at_10_against_exact_search(aio, embedder, vector_store, corpus_embeddings, name):
    passages, P = corpus_embeddings(name)
    questions = datasets.load_questions(name, limit=200, seed=0)
    Q = aio.run(embedder.embed([q.question for q in questions]))
    aio.run(vector_store.create_index(name, P.shape[1]))
    aio.run(vector_store.insert(name, [p.id for p in passages], P, [p.text for p in passages]))
    assert aio.run(vector_store.count(name)) == len(passages)

    hits = aio.run(vector_store.search(name, Q, k=10))
    sims = Q @ P.T
    exact = np.argsort(-sims, axis=1)[:, :10]
    ids = np.array([p.id for p in passages])
    recall = float(np.mean([len(set(ids[e]) & {h.id for h in hh}) / 10 for e, hh in zip(exact, hits)]))
    print(f"\nrecall@10 vs exact search on {name} ({len(passages)} passages, {len(Q)} queries): {recall:.4f}")
    assert recall >= 0.95
    # score = cosine similarity, best first
    assert all(len(hh) == 10 for hh in hits)
    assert all(hh[i].score >= hh[i + 1].score for hh in hits for i in range(9))
    assert abs(hits[0][0].score - float(sims[0, exact[0, 0]])) < 1e-4
    row = {pid: i for i, pid in enumerate(ids)}
    assert hits[0][0].text == passages[row[hits[0][0].id]].text


def test_hnsw_settings_reach_chromadb(aio, vector_store):
    aio.run(vector_store.create_index("cfg", DIM))
    info = aio.run(vector_store.index_info("cfg"))
    assert info["dim"] == DIM and info["count"] == 0
    assert {k: info["hnsw"][k] for k in ("space", "ef_construction", "max_neighbors", "ef_search")} == {
        "space": "cosine", "ef_construction": 200, "max_neighbors": 32, "ef_search": 100}


def test_search_basics_k_clipping_and_empty_index(aio, vector_store):
    vecs = _fill(aio, vector_store)
    hits = aio.run(vector_store.search("docs", vecs[:2], k=10))  # k clipped to 5
    assert [len(h) for h in hits] == [5, 5]
    assert hits[0][0].id == "d0" and hits[1][0].id == "d1"
    assert hits[0][0].score == pytest.approx(1.0, abs=1e-5)
    assert hits[0][0].text == "text 0" and dict(hits[0][0].metadata) == {"i": 0}
    assert all(isinstance(h, Hit) for h in hits[0])
    aio.run(vector_store.create_index("empty", DIM))
    assert aio.run(vector_store.search("empty", vecs[:3], k=4)) == [[], [], []]


def test_execute_merges_search_requests_and_splits_back_in_order(aio, vector_store):
    vecs = _fill(aio, vector_store, n=20)
    _fill(aio, vector_store, n=6, name="other", seed=1)
    reqs = [
        {"index": "docs", "vectors": vecs[[3, 4]], "k": 3},
        {"index": "other", "vectors": vecs[[5]], "k": 2},
        {"index": "docs", "vectors": vecs[[7]], "k": 3},
    ]
    for op in ("search", "vector_search"):  # the primitive name is an alias
        merged = aio.run(vector_store.execute(op, reqs))
        single = [aio.run(vector_store.search(r["index"], r["vectors"], r["k"])) for r in reqs]
        assert [[[h.id for h in hh] for hh in r] for r in merged] == [[[h.id for h in hh] for hh in r] for r in single]
    assert [hh[0].id for hh in merged[0]] == ["d3", "d4"] and merged[2][0][0].id == "d7"
    assert len(merged[1][0]) == 2


def test_execute_merges_insert_requests(aio, vector_store):
    aio.run(vector_store.create_index("docs", DIM))
    v = _unit(np.random.default_rng(3), 5)
    out = aio.run(vector_store.execute("insert", [
        {"index": "docs", "ids": ["a", "b"], "vectors": v[:2], "texts": ["A", "B"]},
        {"index": "docs", "ids": ["c", "d", "e"], "vectors": v[2:], "texts": ["C", "D", "E"], "metadatas": None},
    ]))
    assert out == [2, 3] and aio.run(vector_store.count("docs")) == 5
    assert aio.run(vector_store.search("docs", v[4:5], 1))[0][0].id == "e"


BAD_INSERTS = [
    ({"index": "nope"}, "unknown index 'nope'"),
    ({"vectors": np.ones((2, DIM + 1), np.float32)}, f"dimension {DIM + 1}.*dimension {DIM}"),
    ({"vectors": np.ones(DIM, np.float32)}, "2-D"),
    ({"ids": ["x1"]}, "same length"),
    ({"texts": ["only one"]}, "same length"),
    ({"ids": ["x1", "x1"]}, "duplicate ids"),
    ({"ids": ["d0", "x2"]}, "already in index"),
    ({"ids": [], "vectors": np.ones((0, DIM), np.float32), "texts": []}, "empty"),
    ({"vectors": np.full((2, DIM), np.nan, np.float32)}, "NaN"),
    ({"ids": "x1"}, "single str"),
    ({"metadatas": [{"k": {"nested": 1}}, None]}, "metadatas\\[0\\]"),
    ({"metadatas": [{"k": 1}]}, "1 metadatas for 2 ids"),
]


@pytest.mark.parametrize("override, match", BAD_INSERTS)
def test_bad_insert_raises_before_anything_is_written(aio, vector_store, override, match):
    _fill(aio, vector_store)
    good = {"index": "docs", "ids": ["x1", "x2"], "vectors": _unit(np.random.default_rng(9), 2),
            "texts": ["t1", "t2"], "metadatas": None}
    bad = {**good, **override}
    with pytest.raises(EngineInputError, match=match):
        aio.run(vector_store.insert(**bad))
    # a bad request merged with a good one: the good one is not written either
    with pytest.raises(EngineInputError):
        aio.run(vector_store.execute("insert", [{**good, "ids": ["y1", "y2"]}, bad]))
    assert aio.run(vector_store.count("docs")) == 5


def test_ids_repeated_across_merged_requests_are_rejected(aio, vector_store):
    _fill(aio, vector_store)
    v = _unit(np.random.default_rng(4), 1)
    with pytest.raises(EngineInputError, match="another request"):
        aio.run(vector_store.execute("insert", [
            {"index": "docs", "ids": ["z"], "vectors": v, "texts": ["z"]},
            {"index": "docs", "ids": ["z"], "vectors": v, "texts": ["z"]},
        ]))
    assert aio.run(vector_store.count("docs")) == 5


def test_a_chromadb_failure_mid_write_leaves_nothing_behind(aio, monkeypatch):
    from chromadb.api.models.Collection import Collection

    vs = ChromaVectorStore(insert_batch_size=2)  # 5 vectors -> 3 chromadb add calls
    aio.run(vs.start())
    try:
        _fill(aio, vs, n=3)
        real_add, calls = Collection.add, []

        def failing_add(self, *args, **kwargs):
            calls.append(kwargs["ids"])
            if len(calls) == 2:
                raise RuntimeError("disk full (injected)")
            return real_add(self, *args, **kwargs)

        monkeypatch.setattr(Collection, "add", failing_add)
        with pytest.raises(RuntimeError, match="injected"):
            aio.run(vs.insert("docs", [f"n{i}" for i in range(5)], _unit(np.random.default_rng(5), 5),
                              [f"n{i}" for i in range(5)]))
        assert calls[0] == ["n0", "n1"]  # the first chunk was written, then removed again
        monkeypatch.undo()
        assert aio.run(vs.count("docs")) == 3
        assert {h.id for h in aio.run(vs.search("docs", _unit(np.random.default_rng(6), 1), 10))[0]} == {"d0", "d1", "d2"}
    finally:
        aio.run(vs.close())


def test_bad_search_inputs(aio, vector_store):
    vecs = _fill(aio, vector_store)
    with pytest.raises(EngineInputError, match="unknown index 'nope'.*docs"):
        aio.run(vector_store.search("nope", vecs, 3))
    with pytest.raises(EngineInputError, match=f"dimension 3.*dimension {DIM}"):
        aio.run(vector_store.search("docs", np.ones((1, 3), np.float32), 3))
    with pytest.raises(EngineInputError, match="k must be a positive int"):
        aio.run(vector_store.search("docs", vecs, 0))
    with pytest.raises(EngineInputError, match="index name"):
        aio.run(vector_store.create_index("bad name!", DIM))


def test_create_and_delete_index(aio, vector_store):
    aio.run(vector_store.create_index("a", DIM))
    aio.run(vector_store.create_index("a", DIM))  # exist_ok with the same dim
    with pytest.raises(EngineInputError, match="dimension 8, not 4"):
        aio.run(vector_store.create_index("a", 4))
    with pytest.raises(EngineInputError, match="exists already"):
        aio.run(vector_store.create_index("a", DIM, exist_ok=False))
    assert aio.run(vector_store.list_indexes()) == ["a"]
    aio.run(vector_store.delete_index("a"))
    assert aio.run(vector_store.list_indexes()) == []
    with pytest.raises(EngineInputError, match="unknown index"):
        aio.run(vector_store.count("a"))
    with pytest.raises(EngineInputError, match="unknown index"):
        aio.run(vector_store.delete_index("a"))


def test_in_memory_stores_are_isolated_and_forget_on_close(aio, vector_store):
    _fill(aio, vector_store)
    other = ChromaVectorStore()
    aio.run(other.start())
    try:
        assert aio.run(other.list_indexes()) == []
        with pytest.raises(EngineInputError):
            aio.run(other.count("docs"))
    finally:
        aio.run(other.close())
    assert aio.run(vector_store.count("docs")) == 5
    aio.run(vector_store.close())
    aio.run(vector_store.start())
    assert aio.run(vector_store.list_indexes()) == []


def test_persist_dir_survives_reopen(aio, tmp_path):
    vs = ChromaVectorStore(persist_dir=tmp_path / "store")
    aio.run(vs.start())
    vecs = _fill(aio, vs)
    before = aio.run(vs.search("docs", vecs[:2], 3))
    aio.run(vs.close())

    reopened = ChromaVectorStore(persist_dir=tmp_path / "store")
    aio.run(reopened.start())
    try:
        assert aio.run(reopened.list_indexes()) == ["docs"]
        assert aio.run(reopened.count("docs")) == 5
        after = aio.run(reopened.search("docs", vecs[:2], 3))
        assert [[h.id for h in r] for r in after] == [[h.id for h in r] for r in before]
        assert after[0][0].text == "text 0" and dict(after[0][0].metadata) == {"i": 0}
        with pytest.raises(EngineInputError, match="dimension"):  # the dimension was persisted too
            aio.run(reopened.search("docs", np.ones((1, DIM + 2), np.float32), 1))
    finally:
        aio.run(reopened.close())


def test_unstarted_engine_pickles_for_ray_actors(tmp_path):
    vs = pickle.loads(pickle.dumps(ChromaVectorStore(persist_dir=tmp_path, ef_search=50)))
    assert vs.ef_search == 50 and vs.persist_dir == str(tmp_path) and not vs.started
