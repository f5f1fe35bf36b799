"""Reranking engine (kind ``reranker``).

Two scorers, chosen by ``cross_encoder_path``:

* **a cross-encoder** (``cross_encoder_path`` set): a real sentence-transformers
  ``CrossEncoder`` loaded from that directory, e.g. a local copy of
  ``cross-encoder/ms-marco-MiniLM-L-6-v2``. Its score for (query, text) is the model's
  relevance output. The directory must hold a sequence-classification model with one
  output; anything else is refused (:class:`~teola_plugin.errors.ModelLoadError`) instead
  of being wrapped in a randomly initialised classification head. ``max_length`` (tokens a
  (query, text) pair is cut to) is passed to the ``CrossEncoder``; ``None`` keeps the
  model's own. It changes scores of long texts, so LlamaIndex's ``SentenceTransformerRerank``
  (which loads with ``max_length=512``) is lowered onto this engine only when they agree.
* **the default, a bi-encoder** (no path): the score is the cosine similarity between the
  query's and the text's embeddings from the bundled all-MiniLM-L6-v2 (the same model as
  the default embedder; in one process both share one copy of the weights). These scores
  come from real trained weights and do rank relevant passages first, though a
  cross-encoder is more accurate. Why this default: no package on PyPI ships
  cross-encoder weights usable offline, and a ``CrossEncoder`` built from an encoder
  checkpoint gets a randomly initialised head whose scores mean nothing — so that is
  never done.

``rerank(query, hits, top_n)`` returns the ``top_n`` best hits, stably sorted by the new
score (ties keep their input order), with ``Hit.score`` replaced by that score.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, EngineInputError, ModelLoadError
from .base import Engine, Hit, check_cuda_available, check_texts
from .embedder import (
    acquire_sentence_transformer_async,
    check_device,
    check_model_dir,
    default_model_path,
    encode,
    release_sentence_transformer,
)

__all__ = ["Reranker"]


def _as_hit(h: Any, where: str) -> Hit:
    if isinstance(h, Hit):
        return h
    if isinstance(h, Mapping) and isinstance(h.get("id"), str) and isinstance(h.get("text"), str):
        return Hit(id=h["id"], score=float(h.get("score", 0.0)), text=h["text"], metadata=dict(h.get("metadata") or {}))
    raise EngineInputError(f"{where} must be a Hit (or a dict with str 'id' and 'text'), got {type(h).__name__}")


def _check_top_n(top_n: Any, where: str) -> int | None:
    if top_n is None:
        return None
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise EngineInputError(f"{where} top_n must be a positive int or None, got {top_n!r}")
    return top_n


def _order(hits: list[Hit], scores: Sequence[float], top_n: int | None) -> list[Hit]:
    # sorted() is stable: equal scores keep the retriever's order.
    ranked = sorted(range(len(hits)), key=lambda i: -scores[i])
    if top_n is not None:
        ranked = ranked[:top_n]
    return [Hit(id=hits[i].id, score=float(scores[i]), text=hits[i].text, metadata=hits[i].metadata) for i in ranked]


class Reranker(Engine):
    """Scores (query, text) pairs and reorders retrieved hits.

    Args:
        cross_encoder_path: directory of a sentence-transformers ``CrossEncoder``; ``None``
            = bi-encoder cosine scoring with ``bi_encoder_path``.
        bi_encoder_path: sentence-transformers model for the default scorer; ``None`` = the
            bundled all-MiniLM-L6-v2.
        batch_size: pairs (cross-encoder) or texts (bi-encoder) per forward pass.
        max_length: cross-encoder only: tokens per (query, text) pair; ``None`` = the model's own.
        device: ``"cpu"`` (default), ``"cuda"`` / ``"cuda:N"``, ``"mps"``.

    Operations: ``rerank`` (``batch_rerank`` merges requests ``{"query", "hits", "top_n"}``
    of several queries into one model call).
    """

    kind: ClassVar[str] = "reranker"

    def __init__(
        self,
        cross_encoder_path: str | Path | None = None,
        bi_encoder_path: str | Path | None = None,
        batch_size: int = 32,
        device: str = "cpu",
        name: str | None = None,
        max_length: int | None = None,
    ) -> None:
        super().__init__(name)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if cross_encoder_path is not None and bi_encoder_path is not None:
            raise ConfigError("give cross_encoder_path or bi_encoder_path, not both")
        if max_length is not None:
            if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
                raise ConfigError(f"max_length must be a positive int or None, got {max_length!r}")
            if cross_encoder_path is None:
                raise ConfigError("max_length applies to the cross-encoder only (give cross_encoder_path)")
        self.max_length = max_length
        self.cross_encoder_path = None if cross_encoder_path is None else str(cross_encoder_path)
        self.bi_encoder_path = None if bi_encoder_path is None else str(bi_encoder_path)
        self.batch_size = batch_size
        self.device = check_device(device)
        self._cross: Any = None
        self._bi: Any = None
        self._bi_path: Path | None = None
        self._lock: threading.Lock | None = None

    @property
    def mode(self) -> str:
        """``"cross-encoder"`` or ``"bi-encoder"``."""
        return "cross-encoder" if self.cross_encoder_path is not None else "bi-encoder"

    # -- lifecycle -----------------------------------------------------------------------
    async def _load(self) -> None:
        if self.cross_encoder_path is not None:
            path = check_model_dir(self.cross_encoder_path, "cross-encoder")
            self._cross = await asyncio.to_thread(self._load_cross_encoder, path, self.device, self.max_length)
            self._lock = threading.Lock()
        else:
            path = check_model_dir(
                self.bi_encoder_path if self.bi_encoder_path is not None else default_model_path(),
                "bi-encoder model",
            )
            self._bi, self._lock = await acquire_sentence_transformer_async(path, self.device)
            self._bi_path = path

    @staticmethod
    def _load_cross_encoder(path: Path, device: str, max_length: int | None = None) -> Any:
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cross-encoder directory {str(path)!r} has no readable config.json: {e}") from e
        archs = cfg.get("architectures") or []
        if not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ModelLoadError(
                f"{str(path)!r} is not a cross-encoder: its architectures are {archs}, not a "
                "*ForSequenceClassification model; loading it as a CrossEncoder would add a randomly "
                "initialised head whose scores mean nothing (omit cross_encoder_path for the bi-encoder scorer)"
            )
        check_cuda_available(device)
        from sentence_transformers import CrossEncoder

        try:
            model = CrossEncoder(str(path), device=device, local_files_only=True, max_length=max_length)
        except Exception as e:
            raise ModelLoadError(f"could not load cross-encoder from {str(path)!r}: {e}") from e
        n_labels = getattr(getattr(model, "model", None), "config", None)
        n_labels = getattr(n_labels, "num_labels", 1)
        if n_labels != 1:
            raise ModelLoadError(f"cross-encoder {str(path)!r} has {n_labels} outputs; a reranker needs one score")
        return model

    async def _unload(self) -> None:
        if self._bi_path is not None:
            release_sentence_transformer(self._bi_path, self.device)
        self._cross = self._bi = self._bi_path = self._lock = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(
            mode=self.mode,
            model_path=str(self.cross_encoder_path or self._bi_path or self.bi_encoder_path or "<bundled all-MiniLM-L6-v2>"),
            batch_size=self.batch_size,
            device=self.device,
            max_length=self.max_length,
        )
        return d

    # -- scoring (blocking; run in a worker thread) -------------------------------------
    def _score_groups(self, groups: list[tuple[str, list[str]]]) -> list[list[float]]:
        """Scores for several (query, texts) groups in one model call."""
        if self._cross is not None:
            pairs = [(q, t) for q, texts in groups for t in texts]
            if not pairs:
                return [[] for _ in groups]
            with self._lock:
                flat = self._cross.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
            flat = np.asarray(flat, dtype=np.float64).reshape(-1).tolist()
            out, start = [], 0
            for _, texts in groups:
                out.append(flat[start : start + len(texts)])
                start += len(texts)
            return out
        # bi-encoder: embed each distinct string once (queries and documents repeat across
        # the merged requests of several queries), then dot products of unit vectors.
        uniq = list(dict.fromkeys([q for q, _ in groups] + [t for _, ts in groups for t in ts]))
        emb = encode(self._bi, self._lock, uniq, self.batch_size)
        row = {x: i for i, x in enumerate(uniq)}
        out = []
        for q, ts in groups:
            if not ts:
                out.append([])
                continue
            block = emb[[row[t] for t in ts]]
            out.append((block @ emb[row[q]]).astype(np.float64).tolist())
        return out

    # -- typed API -------------------------------------------------------------------------
    async def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance of each text to ``query`` (higher is more relevant), in input order."""
        self._require_started()
        if not isinstance(query, str):
            raise EngineInputError(f"query must be str, got {type(query).__name__}")
        items = check_texts(texts, "texts")
        (scores,) = await asyncio.to_thread(self._score_groups, [(query, items)])
        return scores

    async def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        """The ``top_n`` (all if None) hits most relevant to ``query``, best first, rescored."""
        (out,) = await self.batch_rerank([{"query": query, "hits": hits, "top_n": top_n}])
        return out

    # -- batched entry point -------------------------------------------------------------
    async def batch_rerank(self, requests: list[dict[str, Any]]) -> list[list[Hit]]:
        """Requests ``{"query", "hits", "top_n"?}`` -> reranked hits each, one model call in all."""
        self._require_started()
        parsed: list[tuple[str, list[Hit], int | None]] = []
        for i, r in enumerate(requests):
            if not isinstance(r, Mapping) or not {"query", "hits"} <= set(r) or set(r) - {"query", "hits", "top_n"}:
                got = sorted(r) if isinstance(r, Mapping) else type(r).__name__
                raise EngineInputError(f"rerank request {i} must have keys query, hits[, top_n], got {got}")
            if not isinstance(r["query"], str):
                raise EngineInputError(f"rerank request {i} query must be str, got {type(r['query']).__name__}")
            hits = r["hits"]
            if isinstance(hits, (str, bytes, Mapping)) or not isinstance(hits, Sequence):
                raise EngineInputError(f"rerank request {i} hits must be a list of Hit, got {type(hits).__name__}")
            parsed.append(
                (
                    r["query"],
                    [_as_hit(h, f"rerank request {i} hits[{j}]") for j, h in enumerate(hits)],
                    _check_top_n(r.get("top_n"), f"rerank request {i}"),
                )
            )
        groups = [(q, [h.text for h in hits]) for q, hits, _ in parsed]
        if any(texts for _, texts in groups):
            scores = await asyncio.to_thread(self._score_groups, groups)
        else:
            scores = [[] for _ in groups]
        return [_order(hits, s, top_n) for (_, hits, top_n), s in zip(parsed, scores)]
