"""The bundled QA data sets: counts, referential integrity, loader behaviour, licence files."""

from __future__ import annotations

import pytest

from teola_plugin import datasets
from teola_plugin.datasets import Passage, Question


def test_available_lists_both_bundled_sets():
    assert datasets.available() == ["squad-xquad-en", "hotpotqa-dev-500"]


@pytest.mark.parametrize(
    "name, n_passages, n_questions, qtype",
    [("squad-xquad-en", 240, 1190, "single-hop"), ("hotpotqa-dev-500", 4858, 500, "multi-hop")],
)
def test_counts_types_and_every_reference_resolves(name, n_passages, n_questions, qtype):
    corpus = datasets.load_corpus(name)
    questions = datasets.load_questions(name)
    assert len(corpus) == n_passages and len(questions) == n_questions
    assert all(isinstance(p, Passage) and p.id and p.title and p.text for p in corpus)
    ids = {p.id for p in corpus}
    assert len(ids) == n_passages  # no duplicate ids
    for q in questions:
        assert isinstance(q, Question) and q.type == qtype and q.question and q.answers
        assert q.supporting_ids and set(q.supporting_ids) <= ids
        assert set(q.context_ids) <= ids


def test_squad_answers_occur_in_their_supporting_passage():
    text = {p.id: p.text for p in datasets.load_corpus("squad-xquad-en")}
    qs = datasets.load_questions("squad-xquad-en")
    assert all(len(q.supporting_ids) == 1 and q.answers[0] in text[q.supporting_ids[0]] for q in qs)
    assert all(q.context_ids == () and q.hotpot_type is None for q in qs)


def test_hotpot_questions_have_two_gold_paragraphs_inside_their_context():
    qs = datasets.load_questions("hotpotqa-dev-500")
    assert all(len(q.supporting_ids) == 2 and set(q.supporting_ids) <= set(q.context_ids) for q in qs)
    assert {q.hotpot_type for q in qs} == {"bridge", "comparison"}
    assert sum(len(q.context_ids) == 10 for q in qs) == 489


def test_combined_corpus_is_the_disjoint_union():
    combined = datasets.combined_corpus()
    assert len(combined) == 240 + 4858
    assert len({p.id for p in combined}) == len(combined)
    assert combined[0].id.startswith("squad-") and combined[-1].id.startswith("hotpot-")


def test_limit_and_seed():
    first = datasets.load_questions("squad-xquad-en", limit=5)
    assert [q.id for q in first] == [q.id for q in datasets.load_questions("squad-xquad-en")[:5]]
    a = datasets.load_questions("squad-xquad-en", limit=20, seed=7)
    b = datasets.load_questions("squad-xquad-en", limit=20, seed=7)
    c = datasets.load_questions("squad-xquad-en", limit=20, seed=8)
    assert [q.id for q in a] == [q.id for q in b] != [q.id for q in c]
    assert len({q.id for q in a}) == 20
    assert len(datasets.load_questions("hotpotqa-dev-500", seed=1)) == 500  # all, shuffled
    with pytest.raises(ValueError, match="limit"):
        datasets.load_questions("squad-xquad-en", limit=-1)


def test_results_are_fresh_lists_so_callers_cannot_corrupt_the_cache():
    corpus = datasets.load_corpus("squad-xquad-en")
    corpus.clear()
    assert len(datasets.load_corpus("squad-xquad-en")) == 240
    qs = datasets.load_questions("squad-xquad-en", limit=3)
    qs.pop()
    assert len(datasets.load_questions("squad-xquad-en", limit=3)) == 3


def test_unknown_name_is_a_value_error_listing_the_valid_names():
    for call in (datasets.load_corpus, datasets.load_questions):
        with pytest.raises(ValueError, match="squad-xquad-en.*hotpotqa-dev-500"):
            call("squad")


@pytest.mark.parametrize("name", ["squad-xquad-en", "hotpotqa-dev-500"])
def test_attribution_and_licence_ship_with_the_data(name):
    folder = datasets.dataset_dir(name)
    assert "CC BY-SA 4.0" in folder.joinpath("SOURCE.md").read_text()
    assert "Attribution-ShareAlike 4.0" in folder.joinpath("LICENSE-CC-BY-SA-4.0.txt").read_text()
