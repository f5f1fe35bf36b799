"""Local keyword search engine (kind ``search``): BM25 over a passage corpus, with ``bm25s``.

It stands in for the "search" primitive of search-augmented apps (a web-search API in the
Teola paper) with something that runs offline and returns real, ranked results. By
default it indexes every bundled corpus (:func:`teola_plugin.datasets.combined_corpus`,
5,098 Wikipedia passages); ``index(passages)`` replaces the corpus with your own.

Each passage is indexed as ``title + text`` (lower-cased, English stop words removed,
Porter-stemmed); a hit carries the passage text and ``metadata={"title": ...}``. Only
passages that share at least one term with the query are returned (score > 0), so a
search can return fewer than ``k`` hits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, EngineInputError
from .base import Engine, Hit, check_texts

__all__ = ["BM25SearchEngine"]


def _porter() -> Callable[[str], str]:
    try:
        from nltk.stem.porter import PorterStemmer
    except ImportError as e:  # pragma: no cover - nltk comes with llama-index-core
        raise ConfigError("stemmer='porter' needs nltk (`pip install nltk`); or pass stemmer=None") from e
    stem = PorterStemmer().stem
    return stem


def _passage_fields(p: Any, i: int) -> tuple[str, str, str]:
    if isinstance(p, Mapping):
        pid, text, title = p.get("id"), p.get("text"), p.get("title", "")
    else:
        pid, text, title = getattr(p, "id", None), getattr(p, "text", None), getattr(p, "title", "")
    if not isinstance(pid, str) or not isinstance(text, str) or not isinstance(title or "", str):
        raise EngineInputError(
            f"passages[{i}] must have str 'id' and 'text' (and optionally 'title'), got {type(p).__name__}"
        )
    return pid, text, title or ""


def _check_k(k: Any, where: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise EngineInputError(f"{where} must be a positive int, got {k!r}")
    return k


class BM25SearchEngine(Engine):
    """BM25 keyword search over a passage corpus.

    Args:
        corpus: what ``start()`` indexes when nothing was indexed yet: ``"combined"``
            (default: every bundled corpus), a bundled data-set name (see
            :func:`teola_plugin.datasets.available`), or ``None`` (start empty; call
            :meth:`index`).
        k1, b, method: BM25 parameters (``bm25s.BM25``; method ``lucene`` by default).
        stemmer: ``"porter"`` (default, nltk's Porter stemmer) or ``None``.
        stopwords: ``"en"`` (default) or ``None``.

    Operations: ``search`` (``batch_search`` merges requests ``{"queries", "k"}`` of
    several queries into one retrieval per distinct ``k``).
    """

    kind: ClassVar[str] = "search"

    def __init__(
        self,
        corpus: str | None = "combined",
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: str | None = "porter",
        stopwords: str | None = "en",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if corpus is not None and corpus != "combined":
            from .. import datasets

            if corpus not in datasets.available():
                raise ConfigError(
                    f"unknown corpus {corpus!r}; use 'combined', None, or one of {datasets.available()}"
                )
        if stemmer not in ("porter", None):
            raise ConfigError(f"stemmer must be 'porter' or None, got {stemmer!r}")
        if stopwords not in ("en", None):
            raise ConfigError(f"stopwords must be 'en' or None, got {stopwords!r}")
        self.corpus = corpus
        self.k1, self.b, self.method = float(k1), float(b), method
        self.stemmer = stemmer
        self.stopwords = stopwords
        self._state: tuple[Any, Any, list[str], list[str], list[str]] | None = None
        self._lock: asyncio.Lock | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def _load(self) -> None:
        self._lock = asyncio.Lock()
        if self._state is None and self.corpus is not None:
            from .. import datasets

            passages = datasets.combined_corpus() if self.corpus == "combined" else datasets.load_corpus(self.corpus)
            self._state = await asyncio.to_thread(self._build, passages)

    async def _unload(self) -> None:
        self._state = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(corpus=self.corpus, size=self.size, k1=self.k1, b=self.b, method=self.method, stemmer=self.stemmer)
        return d

    @property
    def size(self) -> int:
        """Number of indexed passages (0 before indexing)."""
        return 0 if self._state is None else len(self._state[2])

    # -- indexing --------------------------------------------------------------------------
    def _build(self, passages: Sequence[Any]) -> tuple[Any, Any, list[str], list[str], list[str]]:
        import bm25s
        from bm25s.tokenization import Tokenizer

        ids, texts, titles = [], [], []
        seen: set[str] = set()
        for i, p in enumerate(passages):
            pid, text, title = _passage_fields(p, i)
            if pid in seen:
                raise EngineInputError(f"passages[{i}] repeats id {pid!r}")
            seen.add(pid)
            ids.append(pid)
            texts.append(text)
            titles.append(title)
        if not ids:
            raise EngineInputError("passages is empty")
        tokenizer = Tokenizer(
            lower=True,
            stopwords="en" if self.stopwords else None,
            stemmer=_porter() if self.stemmer == "porter" else None,
        )
        docs = [f"{t}\n{x}" if t else x for t, x in zip(titles, texts)]
        corpus_ids = tokenizer.tokenize(docs, update_vocab=True, return_as="ids", show_progress=False)
        retriever = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        retriever.index(tokenizer.to_tokenized_tuple(corpus_ids), show_progress=False)
        return retriever, tokenizer, ids, texts, titles

    async def index(self, passages: Sequence[Any]) -> int:
        """Replace the corpus with ``passages`` (objects or dicts with ``id``, ``text``,
        optional ``title``; e.g. :class:`teola_plugin.datasets.Passage`). Returns the count.

        Validation happens before the old index is replaced: on bad input it stays as it was.
        """
        self._require_started()
        if isinstance(passages, (str, bytes, Mapping)) or not isinstance(passages, Sequence):
            raise EngineInputError(f"passages must be a list, got {type(passages).__name__}")
        state = await asyncio.to_thread(self._build, list(passages))
        async with self._lock:
            self._state = state
        return len(state[2])

    # -- search ------------------------------------------------------------------------------
    @staticmethod
    def _retrieve(state: Any, queries: list[str], k: int) -> list[list[Hit]]:
        # ``state`` is the index captured when the call began, so a concurrent index() swap
        # cannot mix two corpora in one answer.
        retriever, tokenizer, ids, texts, titles = state
        k = min(k, len(ids))
        # update_vocab=False: words the corpus never saw are dropped (an all-unknown query
        # maps to the empty token and scores 0 everywhere).
        q_ids = tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = retriever.retrieve(q_ids, k=k, show_progress=False, n_threads=0)
        out = []
        for row_docs, row_scores in zip(np.asarray(docs), np.asarray(scores)):
            out.append(
                [
                    Hit(id=ids[d], score=float(s), text=texts[d], metadata={"title": titles[d]})
                    for d, s in zip(row_docs.tolist(), row_scores.tolist())
                    if s > 0
                ]
            )
        return out

    async def search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Top-``k`` passages per query, best first (``k`` clipped to the corpus size)."""
        (out,) = await self.batch_search([{"queries": queries, "k": k}])
        return out

    async def batch_search(self, requests: list[dict[str, Any]]) -> list[list[list[Hit]]]:
        """Requests ``{"queries": [...], "k"?}`` -> per request, one hit list per query."""
        self._require_started()
        if self._state is None:
            raise EngineInputError(f"search engine {self.name!r} has no corpus; call index(passages) first")
        parsed: list[tuple[list[str], int]] = []
        for i, r in enumerate(requests):
            if not isinstance(r, Mapping) or "queries" not in r or set(r) - {"queries", "k"}:
                got = sorted(r) if isinstance(r, Mapping) else type(r).__name__
                raise EngineInputError(f"search request {i} must have keys queries[, k], got {got}")
            parsed.append((check_texts(r["queries"], f"request {i} queries"), _check_k(r.get("k", 10), f"request {i} k")))
        # one retrieval per distinct k over every request's queries
        by_k: dict[int, list[int]] = {}
        for i, (_, k) in enumerate(parsed):
            by_k.setdefault(k, []).append(i)
        results: list[list[list[Hit]] | None] = [None] * len(parsed)
        state = self._state
        for k, members in by_k.items():
            flat = [q for i in members for q in parsed[i][0]]
            hits = await asyncio.to_thread(self._retrieve, state, flat, k)
            start = 0
            for i in members:
                n = len(parsed[i][0])
                results[i] = hits[start : start + n]
                start += n
        return results  # type: ignore[return-value]
