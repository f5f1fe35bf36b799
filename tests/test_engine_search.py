"""BM25SearchEngine (bm25s) over the bundled corpora and over a corpus of one's own."""

from __future__ import annotations

import pickle

import pytest

from teola_plugin import datasets
from teola_plugin.datasets import Passage
from teola_plugin.engines import BM25SearchEngine, Hit
from teola_plugin.errors import ConfigError, EngineInputError, EngineNotStartedError


def test_default_index_is_the_combined_corpus(bm25):
    assert bm25.size == 5098 and bm25.describe()["corpus"] == "combined"


def test_gold_squad_passage_in_top_5(aio, bm25):
    qs = datasets.load_questions("squad-xquad-en")
    hits = aio.run(bm25.search([q.question for q in qs], k=5))
    share = sum(q.supporting_ids[0] in {h.id for h in hh} for q, hh in zip(qs, hits)) / len(qs)
    print(f"\nBM25 top-5 hits the gold SQuAD passage for {share:.3f} of {len(qs)} questions (5,098-passage corpus)")
    assert share >= 0.9  # measured 0.965
    assert all(len(hh) <= 5 for hh in hits)
    assert all(hh[i].score >= hh[i + 1].score > 0 for hh in hits for i in range(len(hh) - 1))


def test_a_gold_hotpot_paragraph_in_top_5(aio, bm25):
    qs = datasets.load_questions("hotpotqa-dev-500")
    hits = aio.run(bm25.search([q.question for q in qs], k=5))
    share = sum(bool(set(q.supporting_ids) & {h.id for h in hh}) for q, hh in zip(qs, hits)) / len(qs)
    print(f"\nBM25 top-5 holds a gold HotpotQA paragraph for {share:.3f} of {len(qs)} questions")
    assert share >= 0.9  # measured 0.962


def test_hits_carry_text_and_title(aio, bm25):
    (hits,) = aio.run(bm25.search(["Which NFL team represented the AFC at Super Bowl 50?"], k=3))
    byid = {p.id: p for p in datasets.combined_corpus()}
    assert hits and all(isinstance(h, Hit) for h in hits)
    for h in hits:
        assert h.text == byid[h.id].text and dict(h.metadata) == {"title": byid[h.id].title}
    assert "Super Bowl" in hits[0].metadata["title"]


def test_execute_merges_requests_and_splits_back_in_order(aio, bm25):
    qs = [q.question for q in datasets.load_questions("squad-xquad-en", limit=7, seed=2)]
    reqs = [{"queries": qs[:3], "k": 5}, {"queries": qs[3:4], "k": 2}, {"queries": qs[4:], "k": 5}]
    merged = aio.run(bm25.execute("search", reqs))
    single = [aio.run(bm25.search(r["queries"], r["k"])) for r in reqs]
    one_by_one = [[aio.run(bm25.search([q], r["k"]))[0] for q in r["queries"]] for r in reqs]
    assert merged == single == one_by_one
    assert [len(r) for r in merged] == [3, 1, 3] and all(len(h) <= 2 for h in merged[1])


def test_own_corpus_k_clipping_and_no_match(aio):
    engine = BM25SearchEngine(corpus=None)
    aio.run(engine.start())
    try:
        with pytest.raises(EngineInputError, match="no corpus"):
            aio.run(engine.search(["x"], 3))
        n = aio.run(engine.index([
            Passage("p1", "Volcanoes", "Lava flows from erupting volcanoes."),
            {"id": "p2", "text": "Glaciers are slow rivers of ice."},
            Passage("p3", "Deserts", "Deserts receive little rain."),
        ]))
        assert n == 3 and engine.size == 3
        (hits,) = aio.run(engine.search(["erupting volcano"], k=10))
        assert [h.id for h in hits] == ["p1"]  # k clipped; zero-score passages are not hits
        assert aio.run(engine.search(["quantum chromodynamics"], k=2)) == [[]]
        # stemming: "glacier" matches "Glaciers"
        assert aio.run(engine.search(["glacier"], 1))[0][0].id == "p2"
        # bad passages leave the previous index in place
        with pytest.raises(EngineInputError, match="repeats id 'a'"):
            aio.run(engine.index([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]))
        with pytest.raises(EngineInputError, match="empty"):
            aio.run(engine.index([]))
        with pytest.raises(EngineInputError, match=r"passages\[0\]"):
            aio.run(engine.index([{"text": "no id"}]))
        assert engine.size == 3 and aio.run(engine.search(["rain"], 1))[0][0].id == "p3"
    finally:
        aio.run(engine.close())


@pytest.mark.parametrize(
    "request_, match",
    [
        ({"queries": "one string", "k": 3}, "single str"),
        ({"queries": ["q"], "k": 0}, "k must be a positive int"),
        ({"queries": ["q"], "top_k": 3}, "keys"),
        ({"queries": [], "k": 3}, "empty"),
    ],
)
def test_bad_requests(aio, bm25, request_, match):
    with pytest.raises(EngineInputError, match=match):
        aio.run(bm25.execute("search", [{"queries": ["fine"], "k": 1}, request_]))


def test_lifecycle_config_and_pickling(aio):
    engine = BM25SearchEngine(corpus="squad-xquad-en")
    with pytest.raises(EngineNotStartedError):
        aio.run(engine.search(["x"]))
    with pytest.raises(ConfigError, match="unknown corpus"):
        BM25SearchEngine(corpus="wikipedia")
    with pytest.raises(ConfigError):
        BM25SearchEngine(stemmer="snowball")
    e = pickle.loads(pickle.dumps(engine))
    assert e.corpus == "squad-xquad-en" and not e.started
