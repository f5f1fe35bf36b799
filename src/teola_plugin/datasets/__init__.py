"""Bundled question-answering data sets (CC BY-SA 4.0; see each folder's SOURCE.md).

Two real QA sets ship with the package, so tests, examples and benchmarks run offline:

* ``squad-xquad-en`` — 240 Wikipedia paragraphs, 1,190 single-hop questions (SQuAD v1.1
  dev subset as selected by XQuAD); each question has exactly one supporting paragraph.
* ``hotpotqa-dev-500`` — 4,858 paragraphs, 500 multi-hop questions (HotpotQA dev,
  distractor setting, IRCoT's subsample); two gold paragraphs per question plus the
  question's own 10-paragraph context.

Passage ids never collide between the two (``squad-AA-PP`` / ``hotpot-NNNNN``), so
:func:`combined_corpus` is a plain union. Parsed files are cached; every call returns a
fresh list of immutable records, so callers may sort or slice what they get.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
from dataclasses import dataclass
from importlib import resources

__all__ = [
    "Passage",
    "Question",
    "available",
    "load_corpus",
    "load_questions",
    "combined_corpus",
    "dataset_dir",
]

_NAMES: tuple[str, ...] = ("squad-xquad-en", "hotpotqa-dev-500")


@dataclass(frozen=True)
class Passage:
    """One corpus paragraph."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    """One question with its gold answers and the passage ids that support it.

    ``type`` is ``"single-hop"`` or ``"multi-hop"``; ``context_ids`` is the question's own
    distractor-setting context (HotpotQA; empty for SQuAD); ``hotpot_type`` is HotpotQA's
    ``bridge`` / ``comparison`` (``None`` for SQuAD).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_ids: tuple[str, ...]
    type: str
    context_ids: tuple[str, ...] = ()
    hotpot_type: str | None = None


def available() -> list[str]:
    """Names of the bundled data sets."""
    return list(_NAMES)


def _check_name(name: str) -> str:
    if name not in _NAMES:
        raise ValueError(f"unknown dataset {name!r}; available datasets: {', '.join(_NAMES)}")
    return name


def dataset_dir(name: str):
    """The folder holding ``name``'s files (an importlib.resources Traversable)."""
    return resources.files(__name__).joinpath(_check_name(name))


@functools.lru_cache(maxsize=None)
def _corpus(name: str) -> tuple[Passage, ...]:
    raw = dataset_dir(name).joinpath("corpus.jsonl.gz").read_bytes()
    lines = gzip.decompress(raw).decode("utf-8").splitlines()
    return tuple(
        Passage(id=d["id"], title=d["title"], text=d["text"])
        for d in (json.loads(line) for line in lines if line.strip())
    )


@functools.lru_cache(maxsize=None)
def _questions(name: str) -> tuple[Question, ...]:
    lines = dataset_dir(name).joinpath("questions.jsonl").read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        if not line.strip():
            continue
        d = json.loads(line)
        out.append(
            Question(
                id=d["id"],
                question=d["question"],
                answers=tuple(d["answers"]),
                supporting_ids=tuple(d["supporting_ids"]),
                type=d["type"],
                context_ids=tuple(d.get("context_ids", ())),
                hotpot_type=d.get("hotpot_type"),
            )
        )
    return tuple(out)


def load_corpus(name: str) -> list[Passage]:
    """All passages of data set ``name``, in file order."""
    return list(_corpus(_check_name(name)))


def load_questions(name: str, limit: int | None = None, seed: int | None = None) -> list[Question]:
    """Questions of data set ``name``.

    Without ``seed``: file order, the first ``limit`` ones. With ``seed``: a reproducible
    random sample of ``limit`` questions (all of them, shuffled, when ``limit`` is None).
    """
    qs = list(_questions(_check_name(name)))
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    if seed is not None:
        rng = random.Random(seed)
        return rng.sample(qs, len(qs) if limit is None else min(limit, len(qs)))
    return qs if limit is None else qs[:limit]


@functools.lru_cache(maxsize=1)
def _combined() -> tuple[Passage, ...]:
    out: list[Passage] = []
    seen: set[str] = set()
    for name in _NAMES:
        for p in _corpus(name):
            if p.id in seen:  # ids are disjoint by construction; guard the invariant anyway
                raise RuntimeError(f"passage id {p.id!r} occurs in two bundled data sets")
            seen.add(p.id)
            out.append(p)
    return tuple(out)


def combined_corpus() -> list[Passage]:
    """The union of every bundled corpus (SQuAD first, then HotpotQA): 5,098 passages."""
    return list(_combined())
