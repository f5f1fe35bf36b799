"""Embedding calls made by framework code Teola runs as it is, computed by the embedder engine.

A LangGraph node, an agent's retrieval tool, a LlamaIndex workflow step or chat engine is
user code: Teola runs it unchanged, and it embeds with the app's own model object
(LangChain ``HuggingFaceEmbeddings``, LlamaIndex ``HuggingFaceEmbedding``). In a routing
scope (``scope.py``) such a call goes to the runtime's embedder engine when that engine
computes the same vectors (``capture/embedder_identity.py``: the same model files, the
same normalisation, no prompt or truncation), so the engine scheduler batches it with every
other query's embeddings; the caller gets what its model returns (lists of floats, the
model's own text preparation applied). Any other call runs as it is: a model the engine
does not compute, other encode arguments, images, a call made on the runtime's own loop.

:func:`install` wraps each class's one embedding method (``_embed``) if its module is
loaded; it is idempotent and cheap, so the integrations call it again where a scope begins.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..capture.embedder_identity import huggingface_embeddings_serving, newlines_to_spaces
from .scope import ServedCallScope, current_scope

log = logging.getLogger(__name__)

_ORIGINAL = "__teola_original__"
LANGCHAIN_MODULE = "langchain_huggingface.embeddings.huggingface"  # the community class has no ``_embed``
LLAMA_INDEX_MODULE = "llama_index.embeddings.huggingface.base"


def _langchain_engine(model: Any, scope: ServedCallScope, texts: Any, encode_kwargs: Any) -> str | None:
    if not isinstance(encode_kwargs, dict):
        return None
    return huggingface_embeddings_serving(scope.runtime.specs, model, encode_kwargs)[0]


def _llama_index_engine(model: Any, scope: ServedCallScope, texts: Any, prompt_name: Any = None) -> str | None:
    from ..capture.llama_index_models import embedder_engine_for

    engine, _ = embedder_engine_for(scope.runtime, model)
    return engine


def _langchain_texts(texts: Sequence[str]) -> list[str]:
    return [newlines_to_spaces(text) for text in texts]


def _routed(original: Callable[..., Any], engine_of: Callable[..., str | None],
            prepare: Callable[[Sequence[str]], list[str]]) -> Callable[..., Any]:
    @functools.wraps(original)
    def embed(self: Any, texts: Any, *args: Any, **kwargs: Any) -> Any:
        scope = current_scope()
        if (scope is None or scope.runtime.closed or scope.runtime.in_loop_thread()
                or not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts)):
            return original(self, texts, *args, **kwargs)
        try:
            engine = engine_of(self, scope, texts, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — the identity check is best effort: run as it is
            log.debug("an embedding call stays its model's: %s", exc)
            engine = None
        if engine is None:
            return original(self, texts, *args, **kwargs)
        return _on_engine(scope, engine, prepare(texts))

    setattr(embed, _ORIGINAL, original)
    return embed


def _on_engine(scope: ServedCallScope, engine: str, texts: list[str]) -> list[list[float]]:
    from ..runtime.bridge import started_pool

    async def run() -> Any:
        pool = await started_pool(scope.runtime, engine)
        vectors, _ = await pool.submit("embed", {"texts": texts}, scope.priority)
        return vectors

    return np.asarray(scope.run_sync(run()), dtype=np.float32).tolist()


def _methods() -> list[tuple[type, Callable[..., str | None], Callable[[Sequence[str]], list[str]]]]:
    """(class, engine rule, text preparation) of the loaded embedding classes."""
    found = []
    cls = getattr(sys.modules.get(LANGCHAIN_MODULE), "HuggingFaceEmbeddings", None)
    if cls is not None:
        found.append((cls, _langchain_engine, _langchain_texts))
    cls = getattr(sys.modules.get(LLAMA_INDEX_MODULE), "HuggingFaceEmbedding", None)
    if cls is not None:
        found.append((cls, _llama_index_engine, list))
    return found


def install() -> None:
    """Wrap the loaded embedding classes' ``_embed`` (idempotent); outside a scope they run unchanged."""
    for cls, engine_of, prepare in _methods():
        method = cls.__dict__.get("_embed")
        if method is not None and not hasattr(method, _ORIGINAL):
            setattr(cls, "_embed", _routed(method, engine_of, prepare))


def uninstall() -> None:
    for cls, _, _ in _methods():
        original = getattr(cls.__dict__.get("_embed"), _ORIGINAL, None)
        if original is not None:
            setattr(cls, "_embed", original)
