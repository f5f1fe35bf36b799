"""Framework models and retrievers Teola recognises beyond its own TeolaLLM / TeolaEmbedding.

* ``HuggingFaceEmbedding`` (llama-index-embeddings-huggingface) is served by the runtime's
  embedder engine when both compute the same vectors: the same sentence-transformers
  directory as the engine's (``model_path``, else the bundled all-MiniLM-L6-v2), normalized,
  no query instruction, the directory's own ``max_seq_length``. Then the query embedding
  becomes an ``embed`` primitive (batched with other queries); else it stays the model's
  own call, and the reason is noted.
* ``BM25Retriever`` (llama-index-retrievers-bm25) keeps its own index and tokenizer (stemmer,
  stopwords), which Teola's ``search`` engine (its own BM25 over its own corpus) does not
  reproduce, so it is a pure CPU step calling its own ``retrieve``: it still runs
  concurrently with the graph's other work, and is not reported as opaque.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..ir.node import Ref
from .llama_index import RETRIEVER_RULES, EngineBackedEmbedding, LlamaIndexTracer, lowering_rule


def embedder_engine_for(runtime: Any, embed_model: Any) -> tuple[str | None, str]:
    """(engine name, "") when ``runtime``'s engine computes ``embed_model``'s vectors, else (None, why)."""
    if isinstance(embed_model, EngineBackedEmbedding):
        if getattr(embed_model, "runtime", None) is runtime:
            return embed_model.engine_name, ""
        return None, f"{type(embed_model).__name__} is bound to another runtime"
    if type(embed_model).__name__ == "HuggingFaceEmbedding":
        return _huggingface_engine(runtime, embed_model)
    return None, f"{type(embed_model).__name__} is not served by a Teola engine (use TeolaEmbedding)"


def _huggingface_engine(runtime: Any, model: Any) -> tuple[str | None, str]:
    from ..engines.embedder import default_model_path

    specs = getattr(runtime, "specs", {})
    name = next((n for n, s in specs.items() if s.kind == "embedder" and "SentenceTransformerEmbedder" in s.factory),
                None)
    if name is None:
        return None, "the runtime has no sentence-transformers embedder engine"
    engine_dir = Path(specs[name].kwargs.get("model_path") or default_model_path()).resolve()
    model_dir = Path(str(model.model_name)).expanduser()
    if not model_dir.is_dir() or model_dir.resolve() != engine_dir:
        return None, (f"HuggingFaceEmbedding model {model.model_name!r} is not the embedder engine's "
                      f"model ({engine_dir})")
    prompts = getattr(getattr(model, "_model", None), "prompts", {}) or {}
    if not model.normalize or prompts.get("query"):
        return None, "HuggingFaceEmbedding normalizes differently or adds a query instruction"
    if model.max_length != _max_seq_length(engine_dir):
        return None, f"HuggingFaceEmbedding max_length {model.max_length} differs from the engine's"
    return name, ""


def _max_seq_length(model_dir: Path) -> int | None:
    try:
        return int(json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, KeyError, ValueError):
        return None


def _register_bm25() -> None:
    try:
        from llama_index.retrievers.bm25 import BM25Retriever
    except ImportError:  # optional package
        return

    @lowering_rule(RETRIEVER_RULES, BM25Retriever)
    def lower_bm25(tr: LlamaIndexTracer, retriever: BM25Retriever) -> Ref:
        return tr.cpu_step("bm25_retrieve", lambda query: retriever.retrieve(query), {"query": tr.query},
                           type(retriever).__name__)


_register_bm25()
