"""Per-query document sets sized like a real upload, from the bundled HotpotQA data."""

from __future__ import annotations

import random

from .. import datasets
from ..runtime.values import Document


def upload_for(question: datasets.Question, n_docs: int = 100, seed: int = 0) -> list[Document]:
    """The question's own 10-paragraph context plus seeded distractors from the corpus, shuffled."""
    corpus = datasets.load_corpus("hotpotqa-dev-500")
    by_id = {p.id: p for p in corpus}
    own = [by_id[i] for i in question.context_ids if i in by_id]
    rng = random.Random(f"{seed}-{question.id}")
    others = [p for p in corpus if p.id not in set(question.context_ids)]
    chosen = own + rng.sample(others, max(0, n_docs - len(own)))
    rng.shuffle(chosen)
    return [Document(p.id, f"{p.title}: {p.text}", {"title": p.title}) for p in chosen]
